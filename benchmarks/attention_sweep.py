"""Launch-config sweep of the jqat attention kernels on one GPU, in one process (< 4 min on an H200).

  python benchmarks/attention_sweep.py [--seq 4096] [--head_dim 128] [--heads 16 --kv_heads 16]
      [--causal both|no|yes] [--kinds fwd,bwd] [--only 0,6] [--json sweep.json]

For each candidate forward config (``BLOCK_M, num_warps, num_stages``) and
backward config (dQ and dK/dV tiles, warps, stages; each a delta over the defaults),
at (B, N, K, S, D) = (1, N, K, S, D) (S = --seq, D = --head_dim, N and K = --heads and --kv_heads, 16 each by
default), non-causal and causal (``--only``: those candidates by index, 0 = the default, which is always run first):

- times the forward (``jqat.attention_forward``, Triton) and the backward
  (``jqat.attention_backward`` on the default forward's O' and lse), median of
  repeats of ``iters`` back-to-back calls of a jitted function;
- checks the config: its outputs at the timed size against the default
  config's (``same`` = bitwise equal, else the relative Frobenius error), and at
  a smaller GQA size (1, 1000, 8 heads over 2 KV heads, same D) against the
  pure-JAX reference with the test bounds. ``BAD`` marks a config that misses a
  bound there (a fast-but-wrong config) or fails to compile/run.

Overrides go through ``jqat.ffi.plan.set_config_override`` (the fields of ``ForwardConfig`` /
``BackwardConfig``, as in the ``JQAT_ATTN_FWD_CONFIG`` / ``JQAT_ATTN_BWD_CONFIG`` environment
variables). The table comes last; pick the defaults from it and write them into
``jqat/kernels_triton/attention_{fwd,bwd}.py`` (``FORWARD_CONFIGS`` / ``BACKWARD_CONFIGS``).
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from attention import time_ms  # noqa: E402  (benchmarks/attention.py)

import jqat  # noqa: E402
from jqat.ffi import plan as plans  # noqa: E402

BOUNDS = {"O": 2e-3, "O'": 5e-4, "lse": 1e-5, "dQ": 1e-3, "dK": 1e-3, "dV": 2e-3}

# Forward candidates by head dim (BLOCK_N is the API's block_n = 64: it is part of the function); each a
# set of ForwardConfig fields replacing the defaults.
FWD = {
    128: [
        {},  # the built-in default
        {"block_m": 128, "num_warps": 8, "num_stages": 3},
        {"block_m": 64, "num_warps": 4, "num_stages": 4},
        {"block_m": 64, "num_warps": 4, "num_stages": 2},
    ],
    64: [
        {},
        {"block_m": 128, "num_warps": 8, "num_stages": 2},
        {"block_m": 128, "num_warps": 8, "num_stages": 3},
        {"block_m": 64, "num_warps": 4, "num_stages": 3},
        {"block_m": 128, "num_warps": 4, "num_stages": 4},
    ],
}
# Backward candidates (BackwardConfig fields): dQ (M, N) and dK/dV (keys N, queries M), warps and stages.
BWD = {
    128: [
        {},
        {"dq_num_stages": 2},
        {"kv_block_m": 64},
        {"kv_block_m": 64, "kv_num_stages": 2, "dq_num_stages": 3},
        {"kv_num_stages": 4, "dq_num_stages": 3},
        {"dq_block_n": 32, "dq_num_stages": 4},
        # One warpgroup per dK/dV program (64 keys): two independent programs per SM instead of one of 8 warps.
        {"kv_block_n": 64, "kv_num_warps": 4, "kv_num_stages": 2},
        {"kv_block_n": 64, "kv_num_warps": 4, "kv_num_stages": 3},
    ],
    64: [
        {},
        {"dq_block_m": 128, "dq_block_n": 64, "dq_num_warps": 8, "dq_num_stages": 3},
        {"dq_block_m": 128, "dq_block_n": 64, "dq_num_warps": 4, "dq_num_stages": 3},
        {"kv_block_m": 64, "kv_num_warps": 8, "kv_num_stages": 3},
        {"kv_block_n": 64, "kv_block_m": 64, "kv_num_warps": 4, "kv_num_stages": 3},
        {"kv_num_warps": 4, "dq_num_warps": 4},
        {"kv_block_n": 64, "kv_num_stages": 3},
        {"kv_block_n": 64, "kv_num_stages": 2},
    ],
}


def _fmt(cfg):
  if not cfg:
    return "default"
  short = {"block_m": "M", "num_warps": "w", "num_stages": "s", "dq_block_m": "qM", "dq_block_n": "qN",
           "dq_num_warps": "qw", "dq_num_stages": "qs", "kv_block_n": "kN", "kv_block_m": "kM", "kv_num_warps": "kw",
           "kv_num_stages": "ks"}
  return ",".join(f"{short.get(k, k)}{v}" for k, v in cfg.items())


def _inputs(b, s, n, kh, d, seed):
  ks = jax.random.split(jax.random.key(seed), 4)
  mk = lambda key, h: jax.random.normal(key, (b, s, h, d), jnp.float32).astype(jnp.bfloat16)
  return mk(ks[0], n), mk(ks[1], kh), mk(ks[2], kh), mk(ks[3], n)


def _f32(x):
  return np.asarray(jnp.asarray(x).astype(jnp.float32))


def _rel(a, e):
  a, e = _f32(a), _f32(e)
  fin = np.isfinite(e)
  if not (np.isfinite(a) == fin).all():
    return float("inf")
  a, e = np.where(fin, a, 0), np.where(fin, e, 0)
  return float(np.linalg.norm((a - e).ravel()) / max(np.linalg.norm(e.ravel()), 1e-30))


def _same(a, b):
  return all(np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8)) for x, y in zip(a, b))


def _fwd_fn(causal):
  return jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, is_causal=causal, implementation="triton"))


def _bwd_fn(causal):
  return jax.jit(lambda do, q, k, v, o, lse: jqat.attention_backward(do, q, k, v, o, lse, is_causal=causal,
                                                                     implementation="triton"))


def _sweep_kind(kind, cfgs, make_fn, big_args, small_args, ref, names, causal, rows, args, t_start):
  """Times ``make_fn(causal)(*big_args)`` under each launch config of ``kind`` ("fwd" or "bwd") and checks it: bitwise
  against the first (default) config, and at the small size against the XLA reference ``ref`` (outputs
  ``names``). Appends one row per config to ``rows``; restores the default config at the end."""
  base = None
  for cfg in cfgs:
    row = {"kind": kind, "causal": causal, "config": _fmt(cfg)}
    if cfg and time.perf_counter() - t_start > args.budget_s:
      row["ok"], row["error"] = False, "skipped (time budget)"
      rows.append(row)
      continue
    try:
      plans.set_config_override(kind, cfg)
      fn = make_fn(causal)  # a new jit per config: an existing one would keep its compiled kernels
      out = jax.block_until_ready(fn(*big_args))
      row["ms"] = time_ms(fn, big_args, args.iters, args.repeats)
      if base is None:
        base = out
      row["vs_default"] = "same" if _same(out, base) else f"{max(_rel(a, e) for a, e in zip(out, base)):.1e}"
      errs = {n: _rel(a, e) for n, a, e in zip(names, fn(*small_args), ref)}
      row["ref_err"] = max(errs[n] / BOUNDS[n] for n in errs)  # fraction of the bound used
      row["ok"] = all(errs[n] <= BOUNDS[n] for n in errs)
    except Exception as e:  # a config that does not compile or fit: report it, keep going
      row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[:120]}"
    rows.append(row)
    print(row, flush=True)
  plans.set_config_override(kind, None)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true", help="the first 4 configs of each kind only")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--json", default=None)
  ap.add_argument("--seq", type=int, default=4096, help="sequence length of the timed shape (1, S, heads, D)")
  ap.add_argument("--head_dim", type=int, choices=sorted(FWD), default=128)
  ap.add_argument("--causal", choices=["both", "no", "yes"], default="both")
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--kv_heads", type=int, default=16)
  ap.add_argument("--kinds", default="fwd,bwd", help="which kernels to sweep: fwd, bwd or both")
  ap.add_argument("--only", default=None, help="comma-separated candidate indices (0 = default, always kept)")
  ap.add_argument("--budget_s", type=float, default=200.0, help="skip the remaining configs after this many seconds")
  args = ap.parse_args()
  fwd_cfgs, bwd_cfgs = FWD[args.head_dim], BWD[args.head_dim]
  if args.quick:
    fwd_cfgs, bwd_cfgs = fwd_cfgs[:4], bwd_cfgs[:4]
  if args.only:
    keep = sorted({0, *(int(i) for i in args.only.split(","))})
    fwd_cfgs = [c for i, c in enumerate(fwd_cfgs) if i in keep]
    bwd_cfgs = [c for i, c in enumerate(bwd_cfgs) if i in keep]
  kinds = set(args.kinds.split(","))
  t_start = time.perf_counter()
  d = args.head_dim
  print(jax.devices()[0], f"defaults at D={d}: fwd", plans.forward_config(d), "bwd", plans.backward_config(d),
        flush=True)

  big = _inputs(1, args.seq, args.heads, args.kv_heads, d, seed=0)
  small = _inputs(1, 1000, 8, 2, d, seed=1)
  rows = []
  for causal in {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]:
    # The XLA reference at the small size, once per causal flag.
    sq, sk, sv, sdo = small
    r_fwd = jax.jit(functools.partial(jqat.attention_forward, is_causal=causal, implementation="xla"))(sq, sk, sv)
    r_bwd = jax.jit(functools.partial(jqat.attention_backward, is_causal=causal, implementation="xla"))(
        sdo, sq, sk, sv, r_fwd[1], r_fwd[2])
    q, k, v, do = big
    if "fwd" in kinds:
      _sweep_kind("fwd", fwd_cfgs, _fwd_fn, (q, k, v), (sq, sk, sv), r_fwd, ("O", "O'", "lse"), causal, rows, args,
                  t_start)
    o_hp, lse = _fwd_fn(causal)(q, k, v)[1:]
    if "bwd" in kinds:
      _sweep_kind("bwd", bwd_cfgs, _bwd_fn, (do, q, k, v, o_hp, lse), (sdo, sq, sk, sv, r_fwd[1], r_fwd[2]), r_bwd,
                  ("dQ", "dK", "dV"), causal, rows, args, t_start)

  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  print(f"\n(1,{args.heads},{args.kv_heads},{args.seq},{d}) bf16; ref_err = worst error / test bound at "
        f"(1,1000,8/2 heads,{d}) vs XLA; total {time.perf_counter() - t_start:.0f} s")
  print(f"{'kind':4} {'causal':6} {'config':58} {'ms':>7} {'vs_default':>10} {'ref_err':>7} ok")
  for r in rows:
    ms = f"{r['ms']:7.3f}" if "ms" in r else "      -"
    err = f"{r['ref_err']:7.2f}" if "ref_err" in r else "      -"
    flag = "ok" if r["ok"] else "BAD " + r.get("error", "")
    print(f"{r['kind']:4} {str(r['causal']):6} {r['config']:58} {ms} {r.get('vs_default', '-'):>10} {err} {flag}")


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
