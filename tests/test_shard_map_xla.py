"""The XLA path inside a user's own ``jax.shard_map`` (8 virtual CPU devices, batch- and head-sharded)."""

import numpy as np
import pytest
from conftest import assert_reordered_equal
from multidevice import run_on_cpu_devices

# Runs in a child process (tests/multidevice.py): the unsharded results and those under shard_map, saved to an .npz.
_CHILD = """
import functools
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import jqat

try:
  shard_map = jax.shard_map
except AttributeError:  # jax < 0.7
  from jax.experimental.shard_map import shard_map

assert len(jax.devices()) == 8
IS_CAUSAL = {is_causal}
ks = jax.random.split(jax.random.key(0), 4)
q = jax.random.normal(ks[0], (8, 24, 16, 32), jnp.float32).astype(jnp.bfloat16)  # [B, T, N, D]
k = jax.random.normal(ks[1], (8, 24, 8, 32), jnp.float32).astype(jnp.bfloat16)   # GQA: K = N / 2
v = jax.random.normal(ks[2], (8, 24, 8, 32), jnp.float32).astype(jnp.bfloat16)
do = jax.random.normal(ks[3], (8, 24, 16, 32), jnp.float32).astype(jnp.bfloat16)

attn = functools.partial(jqat.attention, is_causal=IS_CAUSAL, implementation="xla")

def grads(q, k, v, do):
  loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
  return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

results = {{"out": jax.jit(attn)(q, k, v)}}
results.update(zip(("dq", "dk", "dv"), jax.jit(grads)(q, k, v, do)))
mesh = jax.make_mesh((8,), ("x",))
for name, spec in (("batch", P("x")), ("head", P(None, None, "x"))):
  put = lambda t: jax.device_put(t, NamedSharding(mesh, spec))
  args = [put(t) for t in (q, k, v, do)]
  fwd = shard_map(lambda q, k, v: attn(q, k, v), mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
  bwd = shard_map(grads, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 3)
  results[name + "/out"] = jax.jit(fwd)(*args[:3])
  results.update(zip((name + "/dq", name + "/dk", name + "/dv"), jax.jit(bwd)(*args)))
np.savez("{out}", **{{key: np.asarray(x, np.float32) for key, x in results.items()}})
"""


@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_and_grad_inside_shard_map(tmp_path, is_causal):
  out = tmp_path / "results.npz"
  run_on_cpu_devices(_CHILD.format(is_causal=is_causal, out=out))
  results = np.load(out)
  for mesh in ("batch", "head"):
    for name in ("out", "dq", "dk", "dv"):
      # The sharded program is compiled differently from the unsharded one: FP32 order only.
      assert_reordered_equal(results[f"{mesh}/{name}"], results[name], name=f"{mesh}-sharded {name}", dtype="bfloat16")
