"""p_scale="block" vs "row" on the GPU: fwd+bwd time and gradient fidelity (issue 11's defect).

  python benchmarks/numerics_modes.py --out numerics_modes.json [--lengths 4096,16384]

For each shape, jitted ``jax.grad`` through ``jqat.attention`` (Triton) with each p_scale, timed as
the median of repeats of back-to-back calls; and the relative Frobenius error of its dQ, dK, dV
against exact attention's (``jax.nn.dot_product_attention`` in FP32 on the same BF16 inputs, XLA).
Inputs: Q, K, V ~ N(0, 1), D = 128, scale 1/sqrt(D) (diffuse rows: logits ~ N(0, 1)). Under
"block" dV's error grows with T (fq(P) mostly 0); under "row" it should stay near dQ's and dK's.
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from attention import time_ms  # benchmarks/attention.py

import jqat


def _rel(a, e):
  a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
  return float(np.linalg.norm(a - e) / np.linalg.norm(e))


def _exact(q, k, v, do, *, causal):
  f = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
  return jax.vjp(f, *(x.astype(jnp.float32) for x in (q, k, v)))[1](do.astype(jnp.float32))


def _jqat(q, k, v, do, *, causal, p_scale):
  f = lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="triton", p_scale=p_scale)
  return jax.vjp(f, q, k, v)[1](do)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="numerics_modes.json")
  ap.add_argument("--lengths", default="4096,16384")
  ap.add_argument("--heads", type=int, default=16)
  args = ap.parse_args()
  rows = []
  for t in (int(x) for x in args.lengths.split(",")):
    for causal in (False, True):
      ks = jax.random.split(jax.random.key(t), 4)
      shape = (1, t, args.heads, 128)
      q, k, v, do = (jax.random.normal(x, shape, jnp.bfloat16) for x in ks)
      want = jax.jit(functools.partial(_exact, causal=causal))(q, k, v, do)
      for p_scale in ("block", "row"):
        fn = jax.jit(functools.partial(_jqat, causal=causal, p_scale=p_scale))
        got = fn(q, k, v, do)
        row = dict(t=t, heads=args.heads, causal=causal, p_scale=p_scale, fwd_bwd_ms=time_ms(fn, (q, k, v, do), 10, 5),
                   **{f"err_{n}": _rel(g.astype(jnp.float32), w) for n, g, w in zip(("dq", "dk", "dv"), got, want)})
        rows.append(row)
        print(f"T={t:6d} causal={causal!s:5} p_scale={p_scale:5}  fwd+bwd {row['fwd_bwd_ms']:8.2f} ms  "
              f"rel. error vs exact: dQ {row['err_dq']:.3f}  dK {row['err_dk']:.3f}  dV {row['err_dv']:.3f}")
  with open(args.out, "w") as f:
    json.dump({"device": str(jax.devices()[0]), "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
