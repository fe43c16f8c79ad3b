"""Numerics modes on the GPU: fwd+bwd time and gradient fidelity per mode (issue 11's defect).

  python benchmarks/numerics_modes.py --out numerics_modes.json [--lengths 4096,16384]
      [--p-scales block,row] [--smooth-k no,yes] [--qkv-scales block[,tensor]] [--reference-dtype float64]

For each T, causal or not, and each combination of p_scale, smooth_k and qkv_scale: jitted ``jax.vjp``
through ``jqat.attention`` (Triton), and the jitted forward alone (``jqat.attention``: O without the backward's
residuals), each timed as the median of repeats of back-to-back calls (``time_ms`` of benchmarks/attention.py);
and the relative Frobenius error of its O, dQ, dK, dV against exact softmax
attention on the same BF16 inputs. The exact reference (:func:`exact_attention_vjp`) is tiled over query
blocks of 256, so (1, 16384, 16, 128) needs about 4.8 GB in FP64 (XLA's buffer sizes: 3.5 GB of temporaries)
instead of the 48 GB of full [N, T, T] FP32 scores; it runs in FP64 by default (``--reference-dtype float32``:
FP32 with HIGHEST matmul precision, no TF32; half the memory). SmoothK does not change exact attention (a
shift of all keys moves a row's scores by one constant), so one reference serves every mode of a (T, causal).
Inputs: Q, K, V, dO ~ N(0, 1), D = 128, scale 1/sqrt(D) (diffuse rows: logits ~ N(0, 1)). Under "block"
dV's error grows with T (fq(P) mostly 0); under "row" it should stay near dQ's and dK's. A mode the Triton
path refuses (e.g. qkv_scale="tensor" before its kernels exist) prints its reason and the run goes on.
``--implementation xla`` runs jqat's XLA reference instead: a CPU dry run of the whole script at small sizes.
Prints a table and writes JSON and a plot (matplotlib, when installed).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _figure import pyplot, save  # noqa: E402
from attention import time_ms  # noqa: E402  (benchmarks/attention.py)

import jqat  # noqa: E402

REFERENCE_DTYPES = {"float64": jnp.float64, "float32": jnp.float32}


@functools.partial(jax.jit, static_argnames=("is_causal", "scale", "block_q", "dtype"))
def _exact_attention_vjp(query, key, value, d_out, *, is_causal, scale, block_q, dtype):
  b, tq, n, d = query.shape
  tk, kh = key.shape[1], key.shape[2]
  g = n // kh
  nb = -(-tq // block_q)
  hi = jax.lax.Precision.HIGHEST  # FP32 operands: no TF32 or BF16 passes behind the caller's back

  def blocks(x):  # [B, Tq, N, D] -> [nb, B, block_q, K, G, D]; zero rows past Tq (see below)
    x = jnp.pad(x.astype(dtype), ((0, 0), (0, nb * block_q - tq), (0, 0), (0, 0)))
    return x.reshape(b, nb, block_q, kh, g, d).swapaxes(0, 1)

  def unblock(x):  # the inverse of blocks()
    return x.swapaxes(0, 1).reshape(b, nb * block_q, n, d)[:, :tq]

  k, v = key.astype(dtype), value.astype(dtype)
  qb, dob = blocks(query), blocks(d_out)
  starts = jnp.arange(nb) * block_q

  def scores(q, start):  # q: [B, block_q, K, G, D] -> [B, K, G, block_q, Tk], masked keys -inf
    s = scale * jnp.einsum("bqhgd,bkhd->bhgqk", q, k, precision=hi)
    if is_causal:
      visible = jnp.arange(tk)[None, :] <= (start + jnp.arange(block_q))[:, None]
      s = jnp.where(visible, s, -jnp.inf)
    return s

  def forward(args):
    q, start = args
    s = scores(q, start)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("bhgqk,bkhd->bqhgd", p / l, v, precision=hi)
    return o, (m + jnp.log(l))[..., 0]

  ob, lse = jax.lax.map(forward, (qb, starts))  # lse: [nb, B, K, G, block_q]
  delta = jnp.einsum("nbqhgd,nbqhgd->nbhgq", dob, ob, precision=hi)  # rowsum(dO * O)

  def backward(carry, args):
    dk, dv = carry
    q, do, lse_b, delta_b, start = args
    p = jnp.exp(scores(q, start) - lse_b[..., None])
    dp = jnp.einsum("bqhgd,bkhd->bhgqk", do, v, precision=hi)
    ds = p * (dp - delta_b[..., None])
    dq = scale * jnp.einsum("bhgqk,bkhd->bqhgd", ds, k, precision=hi)
    dk = dk + scale * jnp.einsum("bhgqk,bqhgd->bkhd", ds, q, precision=hi)
    dv = dv + jnp.einsum("bhgqk,bqhgd->bkhd", p, do, precision=hi)
    return (dk, dv), dq

  # The zero rows padded past Tq have dO = 0, hence delta = 0, dS = 0 and no share in dK, dV.
  (dk, dv), dqb = jax.lax.scan(backward, (jnp.zeros_like(k), jnp.zeros_like(v)), (qb, dob, lse, delta, starts))
  return unblock(ob), (unblock(dqb), dk, dv)


def exact_attention_vjp(query, key, value, d_out, *, is_causal, scale=None, block_q=256, dtype=jnp.float64):
  """Exact softmax attention and its VJP, tiled over blocks of ``block_q`` queries.

  query, d_out: [B, Tq, N, D]; key, value: [B, Tk, K, D] (N % K == 0); any float dtype, computed in ``dtype``
  (float64 under a local ``jax.enable_x64``, or float32 with HIGHEST matmul precision). Causal is top-left
  (key j visible to query i iff j <= i), so every row sees a key. scale: default 1/sqrt(D).
  Flash-style, never [Tq, Tk] scores for all rows at once: a first pass gives O and lse per query block,
  then delta = rowsum(dO * O), then a second pass recomputes P = exp(S - lse) per block, writes that block's
  dQ and accumulates dK, dV. Peak memory: a few [B, N, block_q, Tk] blocks besides the [B, T, heads, D] arrays.
  Returns ``(out [B, Tq, N, D], (dq [B, Tq, N, D], dk, dv [B, Tk, K, D]))``, all float32 (rounded once from
  ``dtype``).
  """
  b, tq, n, d = query.shape
  if key.shape != value.shape or key.shape[0] != b or key.shape[3] != d or n % key.shape[2]:
    raise ValueError(f"key, value must be [B={b}, Tk, K, D={d}] with N={n} % K == 0, got {key.shape}, {value.shape}")
  if d_out.shape != query.shape:
    raise ValueError(f"d_out must have query's shape {query.shape}, got {d_out.shape}")
  if not isinstance(block_q, int) or block_q < 1:
    raise ValueError(f"block_q must be a positive int, got {block_q!r}")
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
    raise ValueError(f"dtype must be float32 or float64, got {dtype}")
  wide = jnp.dtype(dtype) == jnp.dtype(jnp.float64)
  with jax.enable_x64(True) if wide else contextlib.nullcontext():
    out, grads = _exact_attention_vjp(
      query,
      key,
      value,
      d_out,
      is_causal=is_causal,
      scale=float(d**-0.5 if scale is None else scale),
      block_q=min(block_q, tq),
      dtype=jnp.dtype(dtype),
    )
    return jax.tree.map(lambda x: x.astype(jnp.float32), (out, grads))


@jax.jit
def _rel(actual, expected):
  """||actual - expected|| / ||expected|| (Frobenius), in float32 on the device."""
  a, e = actual.astype(jnp.float32), expected.astype(jnp.float32)
  return jnp.linalg.norm((a - e).ravel()) / jnp.linalg.norm(e.ravel())


def _jqat_out(q, k, v, *, causal, p_scale, smooth_k, qkv_scale, implementation):
  return jqat.attention(
    q, k, v, is_causal=causal, implementation=implementation, p_scale=p_scale, smooth_k=smooth_k, qkv_scale=qkv_scale
  )


def _jqat_vjp(q, k, v, do, **mode):
  out, vjp = jax.vjp(functools.partial(_jqat_out, **mode), q, k, v)
  return out, vjp(do)


def _choices(text, allowed, flag):
  items = [t.strip() for t in text.split(",") if t.strip()]
  if not items or not set(items) <= set(allowed):
    raise SystemExit(f"{flag}: expected a comma-separated subset of {list(allowed)}, got {text!r}")
  return items


def _lengths(text):
  try:
    out = [int(t) for t in text.split(",")]
  except ValueError:
    out = []
  if not out or min(out) < 1:
    raise SystemExit(f"--lengths: expected comma-separated positive integers, got {text!r}")
  return out


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="numerics_modes.json")
  ap.add_argument("--lengths", default="4096,16384", help="sequence lengths T (Tq = Tk)")
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--p-scales", default="block,row", help="p_scale values to run: block, row")
  ap.add_argument("--smooth-k", default="no,yes", help="smooth_k values to run: no, yes")
  ap.add_argument(
    "--qkv-scales",
    default="block",
    help="qkv_scale values to run: block, tensor (tensor needs its Triton kernels; else a reason row)",
  )
  ap.add_argument("--reference-dtype", choices=sorted(REFERENCE_DTYPES), default="float64")
  ap.add_argument("--reference-block-q", type=int, default=256, help="query rows per block of the exact reference")
  ap.add_argument(
    "--implementation",
    choices=["triton", "xla"],
    default="triton",
    help="jqat's implementation (xla: a CPU dry run of the whole script at small sizes)",
  )
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args(argv)
  args.lengths = _lengths(args.lengths)
  args.p_scales = _choices(args.p_scales, ("block", "row"), "--p-scales")
  args.smooth_k = [s == "yes" for s in _choices(args.smooth_k, ("no", "yes"), "--smooth-k")]
  args.qkv_scales = _choices(args.qkv_scales, ("block", "tensor"), "--qkv-scales")
  return args


def _line(r):
  head = (
    f"T={r['t']:6d} causal={r['causal']!s:5} p_scale={r['p_scale']:5} smooth_k={r['smooth_k']!s:5} "
    f"qkv_scale={r['qkv_scale']:6}"
  )
  if "error" in r:
    return f"{head}  -  {r['error']}"
  return (
    f"{head}  fwd {r['fwd_ms']:7.3f} ms  fwd+bwd {r['fwd_bwd_ms']:8.2f} ms  rel. error vs exact: O {r['err_o']:.3f}  "
    f"dQ {r['err_dq']:.3f}  dK {r['err_dk']:.3f}  dV {r['err_dv']:.3f}"
  )


def main(argv=None):
  args = parse_args(argv)
  rows = []
  result = {
    "device": str(jax.devices()[0].device_kind),
    "jax": jax.__version__,
    "implementation": args.implementation,
    "reference_dtype": args.reference_dtype,
    "references": [],
    "rows": rows,
  }
  modes = list(itertools.product(args.p_scales, args.smooth_k, args.qkv_scales))
  for t in args.lengths:
    for causal in (False, True):
      ks = jax.random.split(jax.random.key(t), 4)
      shape = (1, t, args.heads, args.head_dim)
      q, k, v, do = (jax.random.normal(x, shape, jnp.bfloat16) for x in ks)
      t0 = time.perf_counter()
      want_o, want = exact_attention_vjp(
        q, k, v, do, is_causal=causal, block_q=args.reference_block_q, dtype=REFERENCE_DTYPES[args.reference_dtype]
      )
      jax.block_until_ready(want)
      result["references"].append(dict(t=t, causal=causal, seconds_incl_compile=time.perf_counter() - t0))
      for p_scale, smooth_k, qkv_scale in modes:
        row = dict(
          t=t,
          heads=args.heads,
          head_dim=args.head_dim,
          causal=causal,
          p_scale=p_scale,
          smooth_k=smooth_k,
          qkv_scale=qkv_scale,
        )
        mode = dict(causal=causal, p_scale=p_scale, smooth_k=smooth_k, qkv_scale=qkv_scale,
                    implementation=args.implementation)
        fn = jax.jit(functools.partial(_jqat_vjp, **mode))
        out = jax.jit(functools.partial(_jqat_out, **mode))
        try:
          got_o, got = fn(q, k, v, do)
        except RuntimeError as e:  # implementation="triton" refused (a mode without kernels): say so, keep going
          row["error"] = f"{type(e).__name__}: {e}"
        else:
          row["fwd_ms"] = time_ms(out, (q, k, v), args.iters, args.repeats)
          row["fwd_bwd_ms"] = time_ms(fn, (q, k, v, do), args.iters, args.repeats)
          row["err_o"] = float(_rel(got_o, want_o))
          row.update({f"err_{n}": float(_rel(g, w)) for n, g, w in zip(("dq", "dk", "dv"), got, want)})
        rows.append(row)
        print(_line(row), flush=True)
      with open(args.out, "w") as f:  # after every (T, causal): a run cut short keeps what it measured
        json.dump(result, f, indent=1)
  print(
    f"exact reference ({args.reference_dtype}), seconds incl. compile:",
    ", ".join(f"T={r['t']} causal={r['causal']}: {r['seconds_incl_compile']:.1f}" for r in result["references"]),
  )
  print("wrote", args.out)
  _plot(rows, os.path.splitext(args.out)[0] + ".png")


def _plot(rows, path):
  """One panel per output (O, dQ, dK, dV): relative error vs exact against T, a line per mode and causality."""
  plt = pyplot()
  if plt is None:
    return

  done = [r for r in rows if "error" not in r]
  modes = sorted({(r["causal"], r["p_scale"], r["smooth_k"], r["qkv_scale"]) for r in done})
  fig, axes = plt.subplots(1, 4, figsize=(16, 4), sharey=True)
  for ax, (key, title) in zip(axes, (("err_o", "O"), ("err_dq", "dQ"), ("err_dk", "dK"), ("err_dv", "dV"))):
    for causal, p_scale, smooth_k, qkv_scale in modes:
      pts = sorted(
        (r["t"], r[key])
        for r in done
        if (r["causal"], r["p_scale"], r["smooth_k"], r["qkv_scale"]) == (causal, p_scale, smooth_k, qkv_scale)
      )
      label = f"{'causal' if causal else 'full'} p={p_scale}{' smoothK' if smooth_k else ''} qkv={qkv_scale}"
      ax.plot(*zip(*pts), marker="o", linestyle="--" if causal else "-", label=label)
    ax.set_title(f"{title}: rel. error vs exact")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("T")
  axes[0].set_ylabel("relative Frobenius error")
  axes[-1].legend(fontsize=6)
  save(fig, path)


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
