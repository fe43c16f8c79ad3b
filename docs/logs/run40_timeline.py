"""The device timeline of jitted jqat calls (torch.profiler / CUPTI): each kernel's start, duration and the gap
before it, for the last of ITERS back-to-back calls, and the per-call span; (1, S, 16, 128) bf16.
  python run40_timeline.py CASE [CASE ...]   CASE = S:window1024 | S:causal | S:full (as run37_configs.py)
Prints one JSON line per (case, fwd | fwd+bwd)."""
import json, sys
import jax, jax.numpy as jnp, torch
import jqat

ITERS = 8


def keywords(case):
  return {"window1024": {"is_causal": True, "local_window_size": (1023, 0)}, "causal": {"is_causal": True}}.get(case, {})


for item in sys.argv[1:]:
  s, case = item.split(":")
  s = int(s)
  ks = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(kk, (1, s, 16, 128), jnp.float32).astype(jnp.bfloat16) for kk in ks)
  kw = keywords(case)
  attn = lambda q, k, v, kw=kw: jqat.attention(q, k, v, implementation="triton", **kw)
  fns = {"fwd": jax.jit(attn),
         "fwd+bwd": jax.jit(jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))}
  for label, fn in fns.items():
    for _ in range(3):
      jax.block_until_ready(fn(q, k, v))
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
      for _ in range(ITERS):
        out = fn(q, k, v)
      jax.block_until_ready(out)
      torch.cuda.synchronize()
    evs = sorted(((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                  if ev.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e[0])
    per_call = len(evs) // ITERS
    last = evs[-per_call:]
    rows, prev = [], evs[-per_call - 1][1] if len(evs) > per_call else last[0][0]
    for start, end, name in last:
      rows.append({"kernel": name[:48], "us": round(end - start, 1), "gap_before_us": round(start - prev, 1)})
      prev = end
    span = (evs[-1][1] - evs[0][0]) / ITERS
    print(json.dumps({"S": s, "case": case, "call": label, "kernels_per_call": per_call,
                      "mean_span_per_call_us": round(span, 1),
                      "busy_us": round(sum(r["us"] for r in rows), 1),
                      "gaps_us": round(sum(r["gap_before_us"] for r in rows), 1), "last_call": rows}), flush=True)
