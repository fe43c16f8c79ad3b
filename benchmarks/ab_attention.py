"""A/B timing of jqat attention: whichever jqat is importable, on fixed shapes, for comparing two trees.

  PYTHONPATH=<tree A> python benchmarks/ab_attention.py --out a.json
  PYTHONPATH=<tree B> python benchmarks/ab_attention.py --out b.json

Forward and fwd+bwd (``jax.jit(jax.grad(...))``) ms through ``jqat.attention(implementation="triton")``
with every QAT switch on and default keywords (``--p-scale`` adds that one), timed as benchmarks/attention.py
does (``time_ms``).
Alternate the trees in one device session (A, B, A, B) so clock and thermal drift shows up as spread.
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
          (8, 16, 16, 1024, 128, True)]


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True)
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--shapes", default="all", help="'all' or comma-separated indices into SHAPES")
  ap.add_argument("--p-scale", default=None, choices=("block", "row"),
                  help="pass p_scale to jqat.attention (default: leave the keyword out)")
  args = ap.parse_args()
  chosen = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
  rows = []
  for b, n, kh, s, d, causal in chosen:
    ks = jax.random.split(jax.random.key(s + d), 3)
    q = jax.random.normal(ks[0], (b, s, n, d), jnp.float32).astype(jnp.bfloat16)
    k, v = (jax.random.normal(kk, (b, s, kh, d), jnp.float32).astype(jnp.bfloat16) for kk in ks[1:])
    extra = {} if args.p_scale is None else {"p_scale": args.p_scale}
    attn = lambda q, k, v, causal=causal, extra=extra: jqat.attention(q, k, v, is_causal=causal,
                                                                      implementation="triton", **extra)
    fwd = jax.jit(attn)
    grad = jax.jit(jax.grad(lambda q, k, v, attn=attn: jnp.sum(attn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
    rows.append({"shape": [b, n, kh, s, d, causal], "fwd_ms": time_ms(fwd, (q, k, v), args.iters, args.repeats),
                 "fwd_bwd_ms": time_ms(grad, (q, k, v), args.iters, args.repeats)})
    print(rows[-1], flush=True)
  with open(args.out, "w") as f:
    json.dump({"jqat": os.path.dirname(jqat.__file__), "p_scale": args.p_scale, "device": str(jax.devices()[0]),
               "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
