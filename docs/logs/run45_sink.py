"""Forward kernel device ms (torch.profiler CUPTI) on random inputs and on inputs with an attention sink, (1, S, 16,
128) bf16, for the exact rescale skip (run 45): with a sink (key 0's score above every other key's for every row,
as trained LLMs have) the running max settles at the first tile, so every later tile skips the two rescales.
  python run45_sink.py S[:case],...    case: full (default) or causal
One JSON line per (S, case, data)."""
import json, sys
from collections import defaultdict
import jax, jax.numpy as jnp, torch
import jqat


def kernel_ms(fn, reps=10):
  jax.block_until_ready(fn()); torch.cuda.synchronize()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(reps):
      jax.block_until_ready(fn())
    torch.cuda.synchronize()
  tot = defaultdict(float)
  for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA and "attention_fwd" in ev.name:
      tot["attention_fwd"] += ev.device_time / 1e3 / reps
  return round(tot["attention_fwd"], 4)


for item in sys.argv[1].split(","):
  s, case = (item.split(":") + ["full"])[:2]
  s = int(s)
  ks = jax.random.split(jax.random.key(0), 4)
  q, k, v = (jax.random.normal(kk, (1, s, 16, 128), jnp.float32) for kk in ks[:3])
  # The sink: one direction u shared by every query and key 0, scaled so that key 0's score is about 12 (in units
  # of the softmax scale) above the others: its probability is near 1 and it is the row max from the first tile.
  u = jax.random.normal(ks[3], (128,), jnp.float32)
  u = u / jnp.linalg.norm(u)
  qs = q + 3.0 * u
  kz = k.at[:, 0].add(50.0 * u)
  for data, (qq, kk) in (("random", (q, k)), ("sink", (qs, kz))):
    qq, kk, vv = (x.astype(jnp.bfloat16) for x in (qq, kk, v))
    fwd = jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=case == "causal", implementation="triton"))
    print(json.dumps({"S": s, "case": case, "data": data, "fwd_kernel_ms": kernel_ms(lambda: fwd(qq, kk, vv))}),
          flush=True)
