"""JAX binding: wall ms (benchmarks/attention.py's time_ms) and device ms of every kernel (torch.profiler's CUPTI
tracing records the kernels XLA launches) of the jitted forward and of jax.grad, at (B, S, 16, D) bf16.
  python run36_jax_kernels.py S [full|causal|window:W] [D] [B]
Prints one JSON object."""
import sys, json
import jax, jax.numpy as jnp, torch
from collections import defaultdict
sys.path.insert(0, "benchmarks")
from attention import time_ms
import jqat

S = int(sys.argv[1])
case = sys.argv[2] if len(sys.argv) > 2 else "full"
D = int(sys.argv[3]) if len(sys.argv) > 3 else 128
B = int(sys.argv[4]) if len(sys.argv) > 4 else 1
kw = {}
if case == "causal":
  kw = {"is_causal": True}
elif case.startswith("window:"):
  kw = {"is_causal": True, "local_window_size": (int(case[7:]) - 1, 0)}
ks = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(kk, (B, S, 16, D), jnp.float32).astype(jnp.bfloat16) for kk in ks)
attn = lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw)
fwd = jax.jit(attn)
grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))

def profile(fn, reps=10):
  jax.block_until_ready(fn()); torch.cuda.synchronize()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(reps):
      jax.block_until_ready(fn())
    torch.cuda.synchronize()
  tot = defaultdict(float)
  for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA:
      name = next((key for key in ("attention_fwd", "bwd_dkdv", "bwd_dq", "bwd_delta", "fake_quantize") if key in ev.name),
                  ev.name[:40])
      tot[name] += ev.device_time / 1e3 / reps
  return {k: round(v, 4) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}

out = {"S": S, "case": case, "D": D, "B": B}
out["fwd_ms"] = time_ms(fwd, (q, k, v), 10, 5)
out["fwd_bwd_ms"] = time_ms(grad, (q, k, v), 10, 5)
out["fwd_kernels"] = profile(lambda: fwd(q, k, v))
out["fwd_bwd_kernels"] = profile(lambda: grad(q, k, v))
print(json.dumps(out))
