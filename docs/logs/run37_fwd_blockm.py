"""Forward launch configs through the JAX binding: wall ms of the jitted forward (and fwd+bwd for the window) and
device ms of the forward kernel (torch.profiler CUPTI), (1, S, 16, 128) bf16, for each config in argv[2:]
("default" or "field=int,..." as JQAT_ATTN_FWD_CONFIG), cases full / causal / window 1024 at S = argv[1].
  python run37_fwd_blockm.py S CONFIG [CONFIG ...]
One JSON line per (config, case)."""
import sys, json
from collections import defaultdict
import jax, jax.numpy as jnp, torch
sys.path.insert(0, "benchmarks")
from attention import time_ms
import jqat
from jqat.ffi import plan as plans

S = int(sys.argv[1])
CASES = {"full": {}, "causal": {"is_causal": True}, "window1024": {"is_causal": True, "local_window_size": (1023, 0)}}
ks = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(kk, (1, S, 16, 128), jnp.float32).astype(jnp.bfloat16) for kk in ks)


def kernel_ms(fn, reps=10):
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


for config in sys.argv[2:]:
  plans.set_config_override("fwd", None if config == "default" else config)
  for case, kw in CASES.items():
    attn = lambda q, k, v, kw=kw: jqat.attention(q, k, v, implementation="triton", **kw)
    fwd = jax.jit(attn)
    out = {"S": S, "config": config, "case": case, "fwd_ms": round(time_ms(fwd, (q, k, v), 10, 5), 4),
           "fwd_kernels": kernel_ms(lambda: fwd(q, k, v))}
    if case == "window1024":
      grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
      out["fwd_bwd_ms"] = round(time_ms(grad, (q, k, v), 10, 5), 4)
    print(json.dumps(out), flush=True)
