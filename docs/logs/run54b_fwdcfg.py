"""Run 54b (session 23): the primal forward's launch configuration at D = 64 and 128, 128 query rows on 8 warps (two
warpgroups sharing each K/V tile) against the default 64 rows on 4 warps. One process; per round, shape and
configuration a fresh jax.jit of jqat.attention (the primal: nothing differentiates) under
plan.set_config_override("fwd", ...), outputs hashed (a row's arithmetic does not depend on BLOCK_M: must be equal),
and cuDNN's forward in the same round; benchmarks/attention.py's time_ms.
  python3 docs/logs/run54b_fwdcfg.py OUT.json"""
import hashlib, json, sys
import jax, jax.numpy as jnp
import numpy as np
sys.path.insert(0, "benchmarks")
from attention import time_ms
import jqat
from jqat.ffi import plan as plans

SHAPES = [(2, 16, 4096, 64, False), (2, 16, 16384, 64, False), (1, 16, 4096, 128, False), (8, 16, 1024, 128, True),
          (1, 16, 16384, 128, "window")]  # "window": causal, local_window_size=(1023, 0), as benchmarks/masks.py
CONFIGS = {64: ["", "block_m=128,num_warps=8,num_stages=3", "block_m=128,num_warps=8,num_stages=2",
                "block_m=128,num_warps=8,num_stages=4"],
           128: ["", "block_m=128,num_warps=8,num_stages=2", "num_stages=2"]}  # the window: cuDNN full causal
rows = []
for rnd in range(2):
  for b, n, s, d, causal in SHAPES:
    ks = jax.random.split(jax.random.key(s + d), 3)
    q, k, v = (jax.random.normal(kk, (b, s, n, d), jnp.float32).astype(jnp.bfloat16) for kk in ks)
    cud = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal is True, implementation="cudnn"))
    cudnn_ms = round(time_ms(cud, (q, k, v), 10, 5), 4)
    for cfg in CONFIGS[d]:
      plans.set_config_override("fwd", cfg or None)
      kw = dict(is_causal=True, local_window_size=(1023, 0)) if causal == "window" else dict(is_causal=causal)
      fn = jax.jit(lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw))
      try:
        out = fn(q, k, v)
        ms = round(time_ms(fn, (q, k, v), 10, 5), 4)
        row = dict(round=rnd, shape=[b, n, s, d, causal], config=cfg or "default", ms=ms, cudnn_ms=cudnn_ms,
                   ratio=round(ms / cudnn_ms, 3), sha=hashlib.sha256(np.asarray(out).tobytes()).hexdigest()[:16])
      except Exception as e:  # a configuration that does not build or fit
        row = dict(round=rnd, shape=[b, n, s, d, causal], config=cfg, error=f"{type(e).__name__}: {str(e)[:200]}")
      plans.set_config_override("fwd", None)
      print(json.dumps(row), flush=True)
      rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
