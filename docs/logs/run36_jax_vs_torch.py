"""The same QAT forward through the JAX binding (jax-triton custom calls in XLA) and the torch binding, at
(1, 16, S, 128) bf16: wall time per call (JAX: benchmarks/attention.py's time_ms; torch: CUDA events) and the
device time of every kernel (torch.profiler, whose CUPTI tracing also records the kernels XLA launches).
torch runs twice: q, k, v contiguous BHSD, and BTNH storage passed as BHSD views (the JAX layout)."""
import sys, statistics, json
import jax, jax.numpy as jnp, torch
from collections import defaultdict
sys.path.insert(0, "benchmarks")
from attention import time_ms
from _timing import cuda_event_ms
import jqat, jqat.torch as jt

S = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
causal = len(sys.argv) > 2 and sys.argv[2] == "causal"
shape = (1, S, 16, 128)
ks = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
fwd = jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="triton"))

def profile(fn, reps=10):
  fn(); torch.cuda.synchronize()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(reps):
      fn()
    torch.cuda.synchronize()
  tot = defaultdict(float)
  for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA:
      tot[ev.name[:60]] += ev.device_time / 1e3 / reps
  return dict(sorted(tot.items(), key=lambda kv: -kv[1]))

out = {"S": S, "causal": causal}
out["jax_ms"] = time_ms(fwd, (q, k, v), 10, 5)
out["jax_kernels"] = profile(lambda: fwd(q, k, v).block_until_ready())
tq = torch.randn(1, 16, S, 128, device="cuda", dtype=torch.bfloat16)
tk, tv = torch.randn_like(tq), torch.randn_like(tq)
out["torch_bhsd_ms"] = cuda_event_ms(lambda: jt.attention(tq, tk, tv, is_causal=causal), 10, 5)
out["torch_bhsd_kernels"] = profile(lambda: jt.attention(tq, tk, tv, is_causal=causal))
bq, bk, bv = (torch.randn(1, S, 16, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
out["torch_btnh_ms"] = cuda_event_ms(lambda: jt.attention(bq, bk, bv, is_causal=causal), 10, 5)
out["torch_btnh_kernels"] = profile(lambda: jt.attention(bq, bk, bv, is_causal=causal))
print(json.dumps(out, indent=1))
