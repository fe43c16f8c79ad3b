"""Run 56a (session 24): the forward alone against cuDNN's forward, with more samples than runs 53c-55a. One process;
per round and shape, jax.jit(jqat.attention) (the primal, O alone) and jax.jit(jax.nn.dot_product_attention(...,
implementation="cudnn")) alternated, each benchmarks/attention.py's time_ms with 50 back-to-back calls, median of 5.
  python3 docs/logs/run56_fwd.py OUT.json TAG ROUNDS"""
import json, statistics, sys
import jax, jax.numpy as jnp
sys.path.insert(0, "benchmarks")
from attention import time_ms
import jqat

# issue 13's rows: (B, N, K, S, D, causal)
SHAPES = [(1, 16, 16, 4096, 128, False), (1, 16, 16, 4096, 128, True), (1, 16, 16, 16384, 128, False),
          (1, 16, 16, 16384, 128, True), (2, 16, 16, 4096, 64, False), (1, 40, 40, 9360, 128, False),
          (1, 32, 8, 8192, 128, True), (8, 16, 16, 1024, 128, True)]
out, tag, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = []
inputs = {}
for shape in SHAPES:
  b, n, kh, s, d, causal = shape
  ks = jax.random.split(jax.random.key(s + d + n), 3)
  q = jax.random.normal(ks[0], (b, s, n, d), jnp.float32).astype(jnp.bfloat16)
  k, v = (jax.random.normal(kk, (b, s, kh, d), jnp.float32).astype(jnp.bfloat16) for kk in ks[1:3])
  fns = {"jqat": jax.jit(lambda q, k, v, c=causal: jqat.attention(q, k, v, is_causal=c, implementation="triton")),
         "cudnn": jax.jit(lambda q, k, v, c=causal: jax.nn.dot_product_attention(q, k, v, is_causal=c,
                                                                                implementation="cudnn"))}
  inputs[shape] = ((q, k, v), fns)
for rnd in range(rounds):
  for shape, (args, fns) in inputs.items():
    row = dict(tree=tag, round=rnd, shape=list(shape))
    for name in (("jqat", "cudnn") if rnd % 2 == 0 else ("cudnn", "jqat")):
      row[f"{name}_fwd"] = round(time_ms(fns[name], args, 50, 5), 4)
    row["ratio_fwd"] = round(row["jqat_fwd"] / row["cudnn_fwd"], 3)
    print(json.dumps(row), flush=True)
    rows.append(row)
summary = []
for shape in SHAPES:
  r = sorted(x["ratio_fwd"] for x in rows if x["shape"] == list(shape))
  summary.append(dict(shape=list(shape), ratio_median=statistics.median(r), ratio_min=r[0], ratio_max=r[-1],
                      jqat_median=statistics.median(x["jqat_fwd"] for x in rows if x["shape"] == list(shape)),
                      cudnn_median=statistics.median(x["cudnn_fwd"] for x in rows if x["shape"] == list(shape))))
  print(json.dumps(summary[-1]), flush=True)
json.dump(dict(rows=rows, summary=summary), open(out, "w"), indent=1)
