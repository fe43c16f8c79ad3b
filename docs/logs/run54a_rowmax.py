"""Run 54a (session 22): the O-alone forward's unmasked tiles taking the row max of the raw products, scaled once per
row (POS_SCALE), against the per-element product (the tree before). One process: the plan's POS_SCALE flag forced
off and on around a fresh jax.jit each; outputs hashed (they must be equal); benchmarks/attention.py's time_ms.
  python3 docs/logs/run54a_rowmax.py OUT.json"""
import hashlib, json, sys
import jax, jax.numpy as jnp
import numpy as np
sys.path.insert(0, "benchmarks")
from attention import time_ms
import jqat
from jqat.ffi import plan as plans

_forward = plans.attention_forward


def forced(flag):
  def attention_forward(*a, **kw):
    plan = _forward(*a, **kw)
    for launch in plan.launches:
      if "POS_SCALE" in launch.constexprs:
        launch.constexprs["POS_SCALE"] = flag
    return plan
  return attention_forward


rows = []
for rnd in range(2):
  for b, n, s, d, causal in ((1, 16, 4096, 128, False), (2, 16, 4096, 64, False), (1, 16, 4096, 128, True)):
    ks = jax.random.split(jax.random.key(s + d), 3)
    q, k, v = (jax.random.normal(kk, (b, s, n, d), jnp.float32).astype(jnp.bfloat16) for kk in ks)
    for flag in (False, True):
      plans.attention_forward = forced(flag)
      fn = jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="triton"))
      out = fn(q, k, v)
      row = dict(round=rnd, shape=[b, n, s, d, causal], pos_scale=flag, ms=round(time_ms(fn, (q, k, v), 10, 5), 4),
                 sha=hashlib.sha256(np.asarray(out).tobytes()).hexdigest()[:16])
      plans.attention_forward = _forward
      print(json.dumps(row), flush=True)
      rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
