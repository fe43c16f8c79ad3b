"""NVFP4 QAT linear layer on the GPU: jqat.nvfp4.qat_matmul against the BF16 dot, at LLM shapes (issue 42, item 4).

  python benchmarks/qat_matmul.py --out out/qat_matmul [--shapes llm|tiny] [--iters 10] [--repeats 3]
      [--w-pass-configs 16x128x4,16x128x2,16x256x2,16x512x4]

Per shape M x K x N (x: [M, K], w: [K, N], bf16), milliseconds of
  dot          the BF16 dot ``lax.dot_general(x, w)`` (BF16 out, FP32 accumulation in the GEMM), what a BF16 linear
               layer runs, forward and backward (its transpose is two more BF16 dots); qat_matmul calls the same
               GEMM on fq(x), fq(w) (cuBLAS or XLA's GEMM)
  qat          ``qat_matmul(x, w)`` (implementation None: the Triton quantize passes, then that dot)
  xla          ``qat_matmul(x, w, implementation="xla")`` (XLA's quantizer, then that dot)
  *_fwdbwd     forward and backward: ``jax.vjp`` of the op, applied to a random dY, returning y, dX and dW (the
               gradient of sum(y * dY) without the loss's own reduction; ``jax.grad`` alone would let XLA drop the
               forward's dot); qat's backward is two BF16 dots on the forward's fq(x), fq(w)
  fq_x, fq_w   the two quantize passes alone, with their bandwidth (2 bytes read + 2 written per element) against
               ``copy``: XLA's negation of the same bf16 array (one elementwise read and write, copy speed)
  fq_w R x C x W  the W pass under other launch configurations (BLOCK_R x BLOCK_C x num_warps; outputs checked
               bit for bit against the default's): ``--w-pass-configs`` ("" skips)
The ratios qat / dot are checked against the issue's targets (forward <= 1.3x, fwd+bwd <= 1.3x).

Timing: each function jitted, run once, then ``n`` and ``3n`` back-to-back calls per repeat (``n = --iters``),
synchronized once at the end of each; a call's time is the slope ``(T(3n) - T(n)) / 2n`` of the medians over the
repeats, which cancels the fixed cost of a timed run (host synchronization, first launch) that ``T(n) / n``
would spread over the calls (benchmarks/rope_qdq.py). Writes ``<out>/qat_matmul.json`` (after every shape) and
``<out>/qat_matmul.png``. Meant to take under a minute on an H200, compiles included (not yet measured there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
from _figure import pyplot, save  # noqa: E402
from jax import lax

from jqat import nvfp4
from jqat._src import dispatch

LLM = [(8192, 4096, 4096), (8192, 4096, 14336), (16384, 2048, 2048)]
SHAPES = {"llm": LLM, "tiny": [(256, 128, 256)]}  # tiny: a smoke test of the script (on a CPU: XLA only)
TARGETS = {"fwd": 1.3, "fwdbwd": 1.3}
W_PASS_CONFIGS = "16x128x4,16x128x2,16x256x2,16x512x4"


def slope_ms(fn, args, iters: int, repeats: int) -> float:
  """Milliseconds per call of ``fn(*args)``: ``(T(3n) - T(n)) / 2n`` of medians over ``repeats``."""
  jax.block_until_ready(fn(*args))

  def run(n):
    t0 = time.perf_counter()
    for _ in range(n):
      out = fn(*args)
    jax.block_until_ready(out)
    return time.perf_counter() - t0

  t1, t3 = [], []
  for _ in range(repeats):
    t1.append(run(iters))
    t3.append(run(3 * iters))
  return (statistics.median(t3) - statistics.median(t1)) / (2 * iters) * 1e3


def bf16_dot(x, w):
  # Not preferred_element_type=f32 then a cast: its transpose would run the backward's dots on FP32 cotangents.
  return lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def fwdbwd(fn):
  def run(x, w, dy):
    y, vjp = jax.vjp(fn, x, w)
    return (y, *vjp(dy))
  return jax.jit(run)


def parse_w_config(text: str) -> tuple[int, int, int]:
  r, c, warps = (int(v) for v in text.split("x"))
  if r % 16 or r & (r - 1) or c < 16 or c & (c - 1):
    raise ValueError(f"--w-pass-configs: BLOCK_R must be a power of two multiple of 16, BLOCK_C a power of two "
                     f">= 16, got {text}")
  return r, c, warps


def _w_pass_variants(w, configs, iters, repeats, row):
  """Times the W pass under each (BLOCK_R, BLOCK_C, num_warps) and checks its bits against the default plan's."""
  from jqat.ffi import jax_launch  # noqa: PLC0415  (GPU only)
  from jqat.ffi import plan as plans  # noqa: PLC0415

  plan = plans.fake_quantize_columns(jax_launch.dense(w), jax_launch.target(), "bfloat16")
  (launch,) = plan.launches
  default = jax.jit(lambda w: jax_launch.execute(plan, w)[0])(w)
  for r, c, warps in configs:
    grid = (-(-w.shape[0] // r), -(-w.shape[1] // c))
    even = w.shape[0] % r == 0 and w.shape[1] % c == 0
    variant = dataclasses.replace(plan, launches=(dataclasses.replace(
        launch, grid=grid, num_warps=warps, constexprs={**launch.constexprs, "BLOCK_R": r, "BLOCK_C": c,
                                                        "EVEN": even}),))
    name = f"fq_w_{r}x{c}x{warps}"
    try:
      fn = jax.jit(lambda w, p=variant: jax_launch.execute(p, w)[0])
      same = bool(jnp.all(lax.bitcast_convert_type(fn(w), jnp.uint16)
                          == lax.bitcast_convert_type(default, jnp.uint16)))
      row[f"{name}_ms"] = slope_ms(fn, (w,), iters, repeats)
      row[f"{name}_bitwise_equal"] = same
    except Exception as e:  # noqa: BLE001 -- a configuration Triton refuses: report it and go on
      row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"


def bench_shape(m, k, n, iters, repeats, w_configs):
  kx, kw, kd = jax.random.split(jax.random.key(m + k + n), 3)
  x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
  w = (jax.random.normal(kw, (k, n), jnp.float32) / k**0.5).astype(jnp.bfloat16)
  dy = jax.random.normal(kd, (m, n), jnp.float32).astype(jnp.bfloat16)
  triton = dispatch.triton_unavailable_reason() is None
  row = {"M": m, "K": k, "N": n, "qat_implementation": "triton" if triton else "xla"}
  qat = lambda x, w: nvfp4.qat_matmul(x, w)
  xla = lambda x, w: nvfp4.qat_matmul(x, w, implementation="xla")
  row["dot_ms"] = slope_ms(jax.jit(bf16_dot), (x, w), iters, repeats)
  row["qat_ms"] = slope_ms(jax.jit(qat), (x, w), iters, repeats)
  row["xla_ms"] = slope_ms(jax.jit(xla), (x, w), iters, repeats)
  row["dot_fwdbwd_ms"] = slope_ms(fwdbwd(bf16_dot), (x, w, dy), iters, repeats)
  row["qat_fwdbwd_ms"] = slope_ms(fwdbwd(qat), (x, w, dy), iters, repeats)
  row["ratio_fwd"] = row["qat_ms"] / row["dot_ms"]
  row["ratio_fwdbwd"] = row["qat_fwdbwd_ms"] / row["dot_fwdbwd_ms"]
  row["meets_fwd"] = row["ratio_fwd"] <= TARGETS["fwd"]
  row["meets_fwdbwd"] = row["ratio_fwdbwd"] <= TARGETS["fwdbwd"]
  y, y_xla = jax.jit(qat)(x, w).astype(jnp.float32), jax.jit(xla)(x, w).astype(jnp.float32)
  row["rel_err_qat_vs_xla"] = float(jnp.linalg.norm(y - y_xla) / jnp.linalg.norm(y_xla))  # FP32 order noise only
  row["tflops_dot"] = 2 * m * n * k / row["dot_ms"] / 1e9
  gbs = lambda a, ms: 4 * a.size / ms / 1e6  # bf16 in, bf16 out
  for name, a in (("x", x), ("w", w)):
    row[f"copy_{name}_ms"] = ms = slope_ms(jax.jit(lambda a: -a), (a,), iters, repeats)
    row[f"copy_{name}_gbs"] = gbs(a, ms)
  if triton:
    from jqat.ffi import jax_launch  # noqa: PLC0415  (GPU only)

    for name, a, axis in (("x", x, -1), ("w", w, 0)):
      row[f"fq_{name}_ms"] = ms = slope_ms(jax.jit(lambda a, axis=axis: jax_launch.fake_quantize(a, axis)), (a,),
                                           iters, repeats)
      row[f"fq_{name}_gbs"] = gbs(a, ms)
      row[f"fq_{name}_vs_copy"] = row[f"copy_{name}_ms"] / ms
    _w_pass_variants(w, w_configs, iters, repeats, row)
  return row


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="out/qat_matmul", help="output directory")
  ap.add_argument("--shapes", choices=list(SHAPES), default="llm")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--w-pass-configs", default=W_PASS_CONFIGS,
                  help="BLOCK_RxBLOCK_CxWARPS launch configurations of the W pass to time besides the default")
  args = ap.parse_args()
  w_configs = [parse_w_config(c) for c in args.w_pass_configs.split(",") if c.strip()]
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "qat_matmul.json")
  rows = []
  result = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "dtype": "bfloat16",
            "targets": TARGETS, "iters": args.iters, "repeats": args.repeats, "rows": rows}
  print(f"{'M':>6} {'K':>6} {'N':>6} | {'dot':>7} {'qat':>7} {'qat/dot':>7} {'xla':>7} | {'dot f+b':>7} {'qat f+b':>7} "
        f"{'qat/dot':>7} | {'fq(x) GB/s':>10} {'fq(w) GB/s':>10} {'copy GB/s':>9}   (ms; targets: qat/dot <= "
        f"{TARGETS['fwd']} fwd, <= {TARGETS['fwdbwd']} fwd+bwd)")
  for m, k, n in SHAPES[args.shapes]:
    r = bench_shape(m, k, n, args.iters, args.repeats, w_configs)
    rows.append(r)
    g = lambda key, r=r: r.get(key, float("nan"))
    mark = lambda ok: "ok" if ok else "MISS"
    print(f"{m:>6} {k:>6} {n:>6} | {g('dot_ms'):>7.3f} {g('qat_ms'):>7.3f} {g('ratio_fwd'):>6.2f}x {g('xla_ms'):>7.3f} "
          f"| {g('dot_fwdbwd_ms'):>7.3f} {g('qat_fwdbwd_ms'):>7.3f} {g('ratio_fwdbwd'):>6.2f}x | "
          f"{g('fq_x_gbs'):>10.0f} {g('fq_w_gbs'):>10.0f} {g('copy_x_gbs'):>9.0f}   fwd {mark(r['meets_fwd'])}, "
          f"fwd+bwd {mark(r['meets_fwdbwd'])}", flush=True)
    variants = [key[:-3] for key in r if key.startswith("fq_w_") and key.endswith("_ms") and key != "fq_w_ms"]
    if variants:
      print("   W pass by launch config (BLOCK_RxBLOCK_CxWARPS, ms): default " + f"{g('fq_w_ms'):.4f}, " + ", ".join(
          f"{v[5:]} {g(v + '_ms'):.4f}{'' if r.get(v + '_bitwise_equal') else ' (BITS DIFFER)'}" for v in variants))
    for key in [key for key in r if key.endswith("_error")]:
      print(f"   {key}: {r[key]}")
    with open(path, "w") as f:  # after every shape: a run cut short keeps what it measured
      json.dump(result, f, indent=1)
  met = all(r["meets_fwd"] and r["meets_fwdbwd"] for r in rows)
  result["all_targets_met"] = met
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  print(f"targets {'met' if met else 'NOT met'} at every shape; wrote {path}")
  _plot(rows, os.path.join(args.out, "qat_matmul.png"))


def _plot(rows, path):
  plt = pyplot()
  if plt is None:
    return
  labels = [f"{r['M']}x{r['K']}x{r['N']}" for r in rows]
  fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.6), 4))
  for j, (key, label) in enumerate((("ratio_fwd", "forward"), ("ratio_fwdbwd", "forward + backward"))):
    ax.bar([i + (j - 0.5) * 0.4 for i in range(len(rows))], [r[key] for r in rows], 0.4, label=label)
  ax.axhline(TARGETS["fwd"], color="k", linestyle="--", linewidth=1, label=f"target {TARGETS['fwd']}x")
  ax.set_xticks(range(len(rows)), labels, fontsize=8)
  ax.set_ylabel("qat_matmul / BF16 dot (M x K x N, bf16)")
  ax.legend(fontsize=8)
  save(fig, path)


if __name__ == "__main__":
  main()
