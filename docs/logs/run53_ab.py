"""Run 53c (session 22): the quantize pass as one launch for Q, K, V (or K, V), A/B against the tree before
(`base`: f85faa7, three launches, and D <= 64 as before run 53b). One process per tree; per case and round the
primal forward (jax.jit(jqat.attention)) and fwd+bwd (jax.grad of a dO-weighted sum), and cuDNN's, in the same
process; benchmarks/attention.py's time_ms. The window case is benchmarks/masks.py's (1024 at 16k).
  python3 docs/logs/run53_ab.py OUT.json TAG"""
import json, sys
import jax, jax.numpy as jnp
sys.path.insert(0, "benchmarks")
from attention import time_ms
import masks
import jqat

SHAPES = [(8, 16, 16, 1024, 128, True), (1, 16, 16, 4096, 128, False), (2, 16, 16, 4096, 64, False)]
out, tag = sys.argv[1], sys.argv[2]
rows = []


def emit(row):
  print(json.dumps(row), flush=True)
  rows.append(row)


for rnd in range(2):
  for b, n, kh, s, d, causal in SHAPES:
    ks = jax.random.split(jax.random.key(s + d + n), 4)
    q = jax.random.normal(ks[0], (b, s, n, d), jnp.float32).astype(jnp.bfloat16)
    k, v = (jax.random.normal(kk, (b, s, kh, d), jnp.float32).astype(jnp.bfloat16) for kk in ks[1:3])
    do = jax.random.normal(ks[3], (b, s, n, d), jnp.float32).astype(jnp.float32)
    row = dict(tree=tag, round=rnd, shape=[b, n, kh, s, d, causal])
    for name, attn in (("jqat", lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="triton")),
                       ("cudnn", lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                              implementation="cudnn"))):
      loss = lambda q, k, v, attn=attn: jnp.sum(attn(q, k, v).astype(jnp.float32) * do)
      row[f"{name}_fwd"] = round(time_ms(jax.jit(attn), (q, k, v), 10, 5), 4)
      row[f"{name}_fwdbwd"] = round(time_ms(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v), 10, 5), 4)
    row["ratio_fwd"] = round(row["jqat_fwd"] / row["cudnn_fwd"], 3)
    row["ratio_fwdbwd"] = round(row["jqat_fwdbwd"] / row["cudnn_fwdbwd"], 3)
    emit(row)
  w = masks.window(16384, 1024, 10, 5)
  emit(dict(tree=tag, round=rnd, case=w["case"], ms=w["ms"], baseline_ms=w["baseline_ms"],
            ratio=[round(r, 3) for r in w["ratio"]]))
json.dump(rows, open(out, "w"), indent=1)
