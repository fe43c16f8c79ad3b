"""Masks on the GPU: what skipping hidden KV tiles buys, against the two targets of the masks issue.

  python benchmarks/masks.py --out masks.json [--seq 16384] [--doc 1024] [--window 1024]

Three times per case, each a median of repeats of back-to-back calls synchronized at the end (as
benchmarks/attention.py): the jitted forward; fwd+bwd as ``jax.jit(jax.grad(loss))`` of a sum loss through
``jqat.attention`` (Triton); and fwd+bwd as ``jax.jit`` of ``jax.vjp`` applied to a given dO (what a layer in a
model runs). The sum loss adds one kernel that is not attention, the broadcast of its cotangent into dO (an
O(S) write: 40 us at S = 16384 on the H200), which the window's baseline scales down with the
visible fraction; the given dO has none. The targets are judged on the forward and the given-dO fwd+bwd.

- packed: (1, S, 16, 128) packed as S/doc documents of ``doc`` tokens (``q_segment_ids`` /
  ``kv_segment_ids``) against the same documents as a batch (S/doc, doc, 16, 128), causal and not.
  Target: packed / batched <= 1.3.
- window: (1, S, 16, 128) causal with a ``window``-token window (``local_window_size=(window - 1, 0)``)
  against full non-causal attention scaled by the visible fraction of the S x S score matrix.
  Target: window / (fraction * full) <= 1.3.

Launch configs can be varied with ``JQAT_ATTN_FWD_CONFIG`` / ``JQAT_ATTN_BWD_CONFIG`` (jqat/ffi/plan.py);
they apply to the baselines too.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
from _figure import pyplot, save  # noqa: E402
from attention import time_ms  # noqa: E402

import jqat  # noqa: E402

HEADS, HEAD_DIM = 16, 128
TARGET = 1.3


def _grad_fn(**kw):
  def loss(q, k, v):
    return jnp.sum(jqat.attention(q, k, v, implementation="triton", **kw).astype(jnp.float32))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _fwd_fn(**kw):
  return jax.jit(lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw))


def _qkv(b, s, seed=0):
  ks = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(key, (b, s, HEADS, HEAD_DIM), jnp.float32).astype(jnp.bfloat16) for key in ks)


def _vjp_fn(**kw):
  attn = lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw)
  return jax.jit(lambda q, k, v, do: jax.vjp(attn, q, k, v)[1](do))


def _times(args, iters, repeats, **kw):
  """(forward, fwd+bwd of a sum loss, fwd+bwd of a given dO) ms of jqat.attention with keywords ``kw`` on ``args``;
  array keywords are closed over."""
  do = jax.random.normal(jax.random.key(3), args[0].shape, jnp.float32).astype(args[0].dtype)
  return (time_ms(_fwd_fn(**kw), args, iters, repeats), time_ms(_grad_fn(**kw), args, iters, repeats),
          time_ms(_vjp_fn(**kw), (*args, do), iters, repeats))


def packed(s, doc, causal, iters, repeats):
  seg = (jnp.arange(s, dtype=jnp.int32) // doc)[None]
  packed_ms = _times(_qkv(1, s), iters, repeats, is_causal=causal, q_segment_ids=seg, kv_segment_ids=seg)
  batched = tuple(x.reshape(s // doc, doc, HEADS, HEAD_DIM) for x in _qkv(1, s))
  batched_ms = _times(batched, iters, repeats, is_causal=causal)
  return {"case": f"packed {s // doc}x{doc}" + (" causal" if causal else ""), "ms": packed_ms,
          "baseline": f"batched ({s // doc}, {doc})", "baseline_ms": batched_ms,
          "ratio": [a / b for a, b in zip(packed_ms, batched_ms)]}


def window(s, w, iters, repeats):
  visible = sum(min(i + 1, w) for i in range(s))  # causal with w keys per row (the row itself included)
  fraction = visible / (s * s)
  window_ms = _times(_qkv(1, s), iters, repeats, is_causal=True, local_window_size=(w - 1, 0))
  full_ms = _times(_qkv(1, s), iters, repeats)
  return {"case": f"window {w} at {s}", "ms": window_ms, "baseline": f"{fraction:.4f} x full non-causal",
          "baseline_ms": [fraction * t for t in full_ms], "full_ms": full_ms, "visible_fraction": fraction,
          "ratio": [a / (fraction * b) for a, b in zip(window_ms, full_ms)]}


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="masks.json")
  ap.add_argument("--seq", type=int, default=16384)
  ap.add_argument("--doc", type=int, default=1024)
  ap.add_argument("--window", type=int, default=1024)
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--cases", default="packed,window", help="comma-separated subset of: packed, window")
  args = ap.parse_args()
  jqat.enable_compilation_cache()
  cases = set(args.cases.split(","))
  rows = []
  if "packed" in cases:
    rows += [packed(args.seq, args.doc, causal, args.iters, args.repeats) for causal in (False, True)]
  if "window" in cases:
    rows.append(window(args.seq, args.window, args.iters, args.repeats))
  env = {k: os.environ.get(k) for k in ("JQAT_ATTN_FWD_CONFIG", "JQAT_ATTN_BWD_CONFIG")}
  result = {"device": str(jax.devices()[0]), "launch_config_env": env, "heads": HEADS, "head_dim": HEAD_DIM,
            "target": TARGET, "rows": rows}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(f"{'case':<28} {'baseline':<26} {'fwd ms':>8} {'base':>8} {'ratio':>6} {'f+b ms':>8} {'base':>8} "
        f"{'ratio':>6} {'vjp ms':>8} {'base':>8} {'ratio':>6}  target <= {TARGET} (fwd, vjp)")
  for r in rows:
    cells = " ".join(f"{m:8.3f} {b:8.3f} {q:6.3f}" for m, b, q in zip(r["ms"], r["baseline_ms"], r["ratio"]))
    verdict = "ok" if max(r["ratio"][0], r["ratio"][2]) <= TARGET else "MISSED"
    print(f"{r['case']:<28} {r['baseline']:<26} {cells}  {verdict}")
  _plot(rows, os.path.splitext(args.out)[0] + ".png")


def _plot(rows, path):
  plt = pyplot()
  if plt is None:
    return

  fig, ax = plt.subplots(figsize=(7, 4))
  x = range(len(rows))
  for j, label in enumerate(("forward", "fwd+bwd (sum loss)", "fwd+bwd (given dO)")):
    ax.bar([i + 0.27 * (j - 1) for i in x], [r["ratio"][j] for r in rows], 0.27, label=label)
  ax.axhline(TARGET, color="k", ls="--", lw=1, label=f"target {TARGET}")
  ax.set_xticks(list(x), [r["case"] for r in rows], fontsize=8)
  ax.set_ylabel("time / baseline")
  ax.legend()
  save(fig, path)


if __name__ == "__main__":
  main()
