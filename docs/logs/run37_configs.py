"""Launch configs through the JAX binding: wall ms of the jitted forward and of jax.grad, and device ms per kernel
(torch.profiler CUPTI), (B, S, 16, 128) bf16.
  python run37_configs.py KIND CASES CONFIG [CONFIG ...]
KIND: fwd or bwd (which launch config the CONFIGs override: "default" or "field=int,..." as JQAT_ATTN_*_CONFIG);
CASES: comma-separated S:case with case full, causal, window1024, packed_causal1024 / packed1024 (packed as
documents of 1024, causal or not) or gqa_causal (32 query heads over 8 KV heads), e.g. 4096:causal,16384:window1024; a suffix _dN sets the head dim
(default 128), e.g. 4096:full_d256 (added in run 38); tensor / tensor_causal: qkv_scale="tensor" (added in run 47).
One JSON line per (config, case)."""
import sys, json
from collections import defaultdict
import jax, jax.numpy as jnp, torch
sys.path.insert(0, "benchmarks")
from attention import time_ms
import jqat
from jqat.ffi import plan as plans

KIND, CASES, CONFIGS = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]


def keywords(case, s):
  if case == "causal":
    return {"is_causal": True}
  if case == "window1024":
    return {"is_causal": True, "local_window_size": (1023, 0)}
  if case == "gqa_causal":
    return {"is_causal": True}
  if case in ("tensor", "tensor_causal"):
    return {"qkv_scale": "tensor", "is_causal": case == "tensor_causal"}
  if case in ("packed_causal1024", "packed1024"):  # packed1024 (not causal): added in run 38
    seg = (jnp.arange(s, dtype=jnp.int32) // 1024)[None]
    return {"is_causal": case == "packed_causal1024", "q_segment_ids": seg, "kv_segment_ids": seg}
  return {}


def kernel_ms(fn, reps=10):
  jax.block_until_ready(fn()); torch.cuda.synchronize()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(reps):
      jax.block_until_ready(fn())
    torch.cuda.synchronize()
  tot = defaultdict(float)
  for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA:
      name = next((key for key in ("attention_fwd", "bwd_dkdv", "bwd_dq", "bwd_delta", "fake_quantize", "segments")
                   if key in ev.name), ev.name[:40])
      tot[name] += ev.device_time / 1e3 / reps
  return {k: round(v, 4) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}


for config in CONFIGS:
  plans.set_config_override(KIND, None if config == "default" else config)
  for item in CASES:
    s, case = item.split(":")
    s, d = int(s), 128
    if "_d" in case:
      case, d = case.split("_d")[0], int(case.split("_d")[1])
    ks = jax.random.split(jax.random.key(0), 3)
    heads = (32, 8, 8) if case == "gqa_causal" else (16, 16, 16)
    q, k, v = (jax.random.normal(kk, (1, s, n, d), jnp.float32).astype(jnp.bfloat16) for kk, n in zip(ks, heads))
    kw = keywords(case, s)
    attn = lambda q, k, v, kw=kw: jqat.attention(q, k, v, implementation="triton", **kw)
    fwd = jax.jit(attn)
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
    out = {"S": s, "case": case, "D": d, KIND: config, "fwd_ms": round(time_ms(fwd, (q, k, v), 10, 5), 4),
           "fwd_bwd_ms": round(time_ms(grad, (q, k, v), 10, 5), 4),
           "fwd_bwd_kernels": kernel_ms(lambda: grad(q, k, v))}
    print(json.dumps(out), flush=True)
