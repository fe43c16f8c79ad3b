"""One steady-state call's GPU timeline through the JAX binding (torch.profiler CUPTI): each kernel's start (us,
from the first kernel of the call), duration and the idle gap before it, for the jitted forward and jax.grad.
  python run37_timeline.py S case     (case: full, causal, window1024)"""
import sys
import jax, jax.numpy as jnp, torch
import jqat

S, case = int(sys.argv[1]), sys.argv[2]
kw = {"causal": {"is_causal": True}, "window1024": {"is_causal": True, "local_window_size": (1023, 0)}}.get(case, {})
ks = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(kk, (1, S, 16, 128), jnp.float32).astype(jnp.bfloat16) for kk in ks)
attn = lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw)
fns = {"fwd": jax.jit(attn),
       "fwd_bwd": jax.jit(jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))}
for name, fn in fns.items():
  for _ in range(3):
    jax.block_until_ready(fn(q, k, v))
  torch.cuda.synchronize()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    outs = [fn(q, k, v) for _ in range(5)]  # back to back, as time_ms runs them
    jax.block_until_ready(outs)
    torch.cuda.synchronize()
  evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
               key=lambda e: e.time_range.start)
  t0 = evs[0].time_range.start
  print(f"== {S} {case} {name}: {len(evs)} device events over 5 calls")
  prev_end = None
  for e in evs:
    gap = "" if prev_end is None else f"gap {e.time_range.start - prev_end:8.1f}"
    print(f"{e.time_range.start - t0:10.1f} us  {e.time_range.end - e.time_range.start:9.1f} us  {gap:14s} {e.name[:60]}")
    prev_end = e.time_range.end
