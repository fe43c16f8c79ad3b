"""A/B timing of jqat attention: whichever jqat is importable, on fixed shapes, for comparing two trees.

  PYTHONPATH=<tree A> python benchmarks/ab_attention.py --out a.json
  PYTHONPATH=<tree B> python benchmarks/ab_attention.py --out b.json

Forward and fwd+bwd (``jax.jit(jax.grad(...))``) ms through ``jqat.attention(implementation="triton")``
with every QAT switch on and default keywords (``--p-scale`` adds that one), timed as benchmarks/attention.py
does (``time_ms``). ``--cudnn`` also times ``jax.nn.dot_product_attention(implementation="cudnn")`` on the same
inputs in the same process, and prints jqat's ratios to it.
Alternate the trees on one machine (A, B, A, B) so clock and thermal drift shows up as spread.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
from attention import time_ms  # benchmarks/attention.py

import jqat

# (B, N, K, S, D, causal)
SHAPES = [(1, 16, 16, 4096, 128, False), (1, 16, 16, 4096, 128, True), (2, 16, 16, 4096, 64, False),
          (8, 16, 16, 1024, 128, True), (1, 16, 16, 16384, 128, False), (1, 16, 16, 16384, 128, True),
          (1, 40, 40, 9360, 128, False), (1, 32, 8, 8192, 128, True)]  # 4-7: the rest of issue 13's table


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True)
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--shapes", default="all", help="'all' or comma-separated indices into SHAPES")
  ap.add_argument("--p-scale", default=None, choices=("block", "row"),
                  help="pass p_scale to jqat.attention (default: leave the keyword out)")
  ap.add_argument("--cudnn", action="store_true", help="also time cuDNN BF16 attention (jax.nn) on each shape")
  ap.add_argument("--fwd-only", action="store_true", help="time the forward alone (no fwd+bwd)")
  args = ap.parse_args()
  chosen = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
  rows = []
  for b, n, kh, s, d, causal in chosen:
    ks = jax.random.split(jax.random.key(s + d), 3)
    q = jax.random.normal(ks[0], (b, s, n, d), jnp.float32).astype(jnp.bfloat16)
    k, v = (jax.random.normal(kk, (b, s, kh, d), jnp.float32).astype(jnp.bfloat16) for kk in ks[1:])
    extra = {} if args.p_scale is None else {"p_scale": args.p_scale}
    impls = {"": lambda q, k, v, causal=causal, extra=extra: jqat.attention(q, k, v, is_causal=causal,
                                                                           implementation="triton", **extra)}
    if args.cudnn:
      impls["cudnn_"] = lambda q, k, v, causal=causal: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                                     implementation="cudnn")
    row = {"shape": [b, n, kh, s, d, causal]}
    for prefix, attn in impls.items():
      fwd = jax.jit(attn)
      grad = jax.jit(jax.grad(lambda q, k, v, attn=attn: jnp.sum(attn(q, k, v).astype(jnp.float32)),
                              argnums=(0, 1, 2)))
      row[prefix + "fwd_ms"] = time_ms(fwd, (q, k, v), args.iters, args.repeats)
      if not args.fwd_only:
        row[prefix + "fwd_bwd_ms"] = time_ms(grad, (q, k, v), args.iters, args.repeats)
    if args.cudnn:
      row["ratio_fwd"] = row["fwd_ms"] / row["cudnn_fwd_ms"]
      if not args.fwd_only:
        row["ratio_fwd_bwd"] = row["fwd_bwd_ms"] / row["cudnn_fwd_bwd_ms"]
    rows.append(row)
    print(rows[-1], flush=True)
  with open(args.out, "w") as f:
    json.dump({"jqat": os.path.dirname(jqat.__file__), "p_scale": args.p_scale, "device": str(jax.devices()[0]),
               "fwd_kernel": os.environ.get("JQAT_ATTN_FWD_KERNEL", ""),
               "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
