"""Run 47a (prepared in session 18, not yet run): what does a launch with global scratch cost the jitted forward, and
is it the stream-ordered pool giving its memory back at every synchronization?

  python3 docs/logs/run47_pool.py [--keep-pool]

Prints one JSON line per (shape, iters): the jitted forward's median ms (benchmarks/attention.py's time_ms: `iters`
back-to-back calls, then one sync, 5 repeats) and the device's default memory pool's counters (reserved / used, high
water marks) after it. jaxlib's TritonKernel and jqat's callback launcher take a descriptor kernel's scratch from
that pool with cuMemAllocAsync: used_high > 0 confirms it. --keep-pool first sets the pool's release threshold to
UINT64_MAX (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), so freed scratch stays mapped across synchronizations. Run it in
main's tree (no scratch) and in this one, with and without --keep-pool, and compare."""
import ctypes
import json
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, "benchmarks")
from attention import time_ms  # noqa: E402

import jqat  # noqa: E402

_ATTR = {"release_threshold": 4, "reserved": 5, "reserved_high": 6, "used": 7, "used_high": 8}


def pool():
  lib = ctypes.CDLL("libcuda.so.1")
  dev, handle = ctypes.c_int(), ctypes.c_void_p()
  assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
  assert lib.cuDeviceGetDefaultMemPool(ctypes.byref(handle), dev) == 0
  return lib, handle


def counters():
  lib, handle = pool()
  out = {}
  for name, attr in _ATTR.items():
    v = ctypes.c_uint64()
    assert lib.cuMemPoolGetAttribute(handle, attr, ctypes.byref(v)) == 0
    out[name] = v.value
  return out


jax.block_until_ready(jnp.zeros(1))  # JAX's CUDA context first
if "--keep-pool" in sys.argv:
  lib, handle = pool()
  big = ctypes.c_uint64(2**64 - 1)
  assert lib.cuMemPoolSetAttribute(handle, _ATTR["release_threshold"], ctypes.byref(big)) == 0
for b, s, d, causal in ((1, 4096, 128, False), (1, 4096, 128, True), (8, 1024, 128, True), (1, 4096, 256, False),
                        (1, 16384, 128, True)):
  ks = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(kk, (b, s, 16, d), jnp.float32).astype(jnp.bfloat16) for kk in ks)
  fwd = jax.jit(lambda q, k, v, c=causal: jqat.attention(q, k, v, is_causal=c, implementation="triton"))
  for iters in (1, 10, 50):
    ms = time_ms(fwd, (q, k, v), iters, 5)
    print(json.dumps({"B": b, "S": s, "D": d, "causal": causal, "iters": iters, "keep_pool": "--keep-pool" in sys.argv,
                      "fwd_ms": round(ms, 4), "pool": counters()}), flush=True)
