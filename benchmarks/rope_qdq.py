"""Tail RoPE + microscaled QDQ: Triton kernel vs a device-to-device copy and vs the jitted XLA reference.

  python benchmarks/rope_qdq.py --out rope_qdq.json [--rows 1024,1048576] [--iters 20]

Effective bandwidth counts x read + x written + one 256-byte cache row and one
position id per position. The baseline is a true device-to-device copy of x's
bytes (read + write every byte), measured in the same process and run:
``dst.copy_(src)`` through torch (cudaMemcpyAsync D2D, CUDA events) when torch
with CUDA is importable, and a jitted XLA copy (an HLO ``copy`` of the
parameter into a fresh output buffer, which XLA must materialize) always; the
faster of the two is the baseline (``copy_method`` says which).

Timing of the JAX ops (ours, the reference, the XLA copy): one jitted step,
x donated and carried, dispatched back to back ``n`` times and synchronized
once at the end; the time per step is the two-point slope
``(T(3K) - T(K)) / 2K`` of medians over repeats. The slope cancels the fixed
cost of each timed run (the final host synchronization and the first launch,
about 0.5 ms on an H200), which a plain ``T(K) / K`` spreads over the steps:
with K = 20 that added 0.025 ms to a 0.144 ms step. (An XLA:GPU while loop
is no way out: it costs each iteration a device-to-host copy of its predicate.)
Small row counts are dispatch-bound (a few microseconds of host work per step).
Targets on H200: >= 80% of copy bandwidth at >= 1M rows, >= 3x the reference.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from _figure import pyplot, save  # noqa: E402
from _timing import cuda_event_ms  # noqa: E402
from jax import lax

import jqat  # noqa: E402
from jqat._src.rope_qdq import rope_qdq  # noqa: E402

MODES = {  # name -> (keywords, row width, heads per token)
    "fp4/32/ue8m0": (dict(quantization="fp4", group_size=32, scale_format="ue8m0"), 128, 4),
    "fp8/32/ue8m0": (dict(quantization="fp8", group_size=32, scale_format="ue8m0"), 512, 1),
    "fp4/16/e4m3": (dict(quantization="fp4", group_size=16, scale_format="e4m3"), 512, 1),
}
ROWS = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)
CACHE_POSITIONS = 8192


def moved_bytes(mode, rows):
  """Bytes an in-place op must move for ``rows`` rows: x read and written (bf16), and per position one
  256-byte cache row and one int32 id."""
  _, width, heads = MODES[mode]
  return 2 * rows * width * 2 + rows // heads * (64 * 4 + 4)


def _inputs(mode, rows, key):
  kw, width, heads = MODES[mode]
  kx, kp, kc = jax.random.split(key, 3)
  shape = (rows // heads, heads, width) if heads > 1 else (rows, width)
  x = jax.random.normal(kx, shape, jnp.float32).astype(jnp.bfloat16)
  n_pos = rows // heads
  positions = jax.random.randint(kp, (n_pos,), 0, CACHE_POSITIONS, jnp.int32)
  ang = jax.random.uniform(kc, (CACHE_POSITIONS, 32), jnp.float32, 0, 100)
  cache = jnp.concatenate([jnp.cos(ang), jnp.sin(ang)], axis=1)
  return x, cache, positions, moved_bytes(mode, rows)


def _runs_seconds(fn, x, args, n, repeats):
  """Median seconds of ``n`` back-to-back calls ``x = fn(x, *args)``, one synchronization at the end."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(n):
      x = fn(x, *args)
    jax.block_until_ready(x)
    times.append(time.perf_counter() - t0)
  return x, statistics.median(times)


def _step_seconds(fn, x, args, k, repeats):
  """Seconds per step of ``x = fn(x, *args)``: the slope between k and 3k back-to-back steps."""
  x = jax.block_until_ready(fn(x, *args))  # compile + warm up
  x, short = _runs_seconds(fn, x, args, k, repeats)
  x, long = _runs_seconds(fn, x, args, 3 * k, repeats)
  return (long - short) / (2 * k)


def _time(step, x, cache, positions, k, repeats):
  """Seconds per step of ``x = step(x, cache, positions)`` jitted with x donated (written in place)."""
  return _step_seconds(jax.jit(step, donate_argnums=0), x, (cache, positions), k, repeats)


def _xla_copy_seconds(x, k, repeats):
  """Seconds of one D2D copy of ``x`` by XLA, timed like the ops (two-point slope).

  ``optimization_barrier(x)`` keeps JAX from forwarding the input as the output, so the
  compiled module is ``ROOT copy(parameter)``: a non-donated parameter cannot be the
  output buffer, and XLA materializes the copy (a device memcpy on the GPU). Each call
  copies the previous call's output.
  """
  return _step_seconds(jax.jit(lax.optimization_barrier), x, (), k, repeats)


def _torch_copy_seconds(x, k, repeats):
  """Median seconds of one ``dst.copy_(src)`` (cudaMemcpyAsync D2D) of x's shape and dtype, by CUDA events.

  Returns None (with the reason printed once) when torch with CUDA is unavailable or
  the two buffers do not fit beside JAX's pool.
  """
  global _TORCH_NOTE
  try:
    import torch
    if not torch.cuda.is_available():
      raise RuntimeError("torch has no CUDA device")
    src = torch.randn(tuple(x.shape), device="cuda").to(torch.bfloat16)  # not zeros: real data
    dst = torch.empty_like(src)
    seconds = cuda_event_ms(functools.partial(dst.copy_, src), iters=k, repeats=repeats) / 1e3
    del src, dst
    torch.cuda.empty_cache()
    return seconds
  except Exception as e:  # ImportError, no CUDA build, out of memory: fall back to XLA's copy
    if _TORCH_NOTE is None:
      _TORCH_NOTE = f"{type(e).__name__}: {e}"
      print(f"torch D2D copy unavailable ({_TORCH_NOTE}); baseline is the XLA copy", flush=True)
    return None


_TORCH_NOTE = None


def bench(mode, rows, iters, repeats):
  kw, _, _ = MODES[mode]
  x, cache, positions, nbytes = _inputs(mode, rows, jax.random.PRNGKey(rows))
  k = iters if x.size <= 1 << 26 else max(2, iters // 4)  # fewer steps for the largest arrays
  copy_bytes = 2 * x.size * x.dtype.itemsize  # read + write of x
  ours = _time(lambda x, c, p: rope_qdq(x, c, p, **kw, implementation="triton"), jnp.copy(x), cache, positions, k,
               repeats)
  ref = _time(lambda x, c, p: rope_qdq(x, c, p, **kw, implementation="xla"), jnp.copy(x), cache, positions, k,
              repeats)
  copies = {"xla": _xla_copy_seconds(x, k, repeats)}
  torch_s = _torch_copy_seconds(x, k, repeats)
  if torch_s is not None:
    copies["torch"] = torch_s
  method = min(copies, key=copies.get)  # the fastest D2D copy is the baseline
  copy = copies[method]
  copy_gbs = copy_bytes / copy / 1e9
  ours_gbs = nbytes / ours / 1e9
  r = dict(mode=mode, rows=rows, shape=list(x.shape), bytes=nbytes, copy_bytes=copy_bytes, steps=k,
           ours_ms=ours * 1e3, reference_ms=ref * 1e3, ours_gbs=ours_gbs,
           copy_method=method, copy_ms=copy * 1e3, copy_gbs=copy_gbs,
           copy_xla_gbs=copy_bytes / copies["xla"] / 1e9,
           copy_torch_gbs=copy_bytes / torch_s / 1e9 if torch_s is not None else None,
           pct_of_copy=100 * ours_gbs / copy_gbs, copy_time_over_ours=copy / ours,
           speedup_vs_reference=ref / ours)
  return r


TARGET_ROWS = 1 << 20
TARGET_PCT_OF_COPY = 80.0
TARGET_SPEEDUP = 3.0


def _summary(r):
  """Pass/fail of one (mode, rows) result against both targets, as a dict with a printable line."""
  bw_ok = r["pct_of_copy"] >= TARGET_PCT_OF_COPY
  ref_ok = r["speedup_vs_reference"] >= TARGET_SPEEDUP
  line = (f"{r['mode']:<14} rows {r['rows']:>8}: {r['ours_ms']:.4f} ms, {r['pct_of_copy']:5.1f}% of "
          f"{r['copy_method']} D2D copy "
          f"[{'PASS' if bw_ok else 'FAIL'}], {r['speedup_vs_reference']:5.1f}x vs reference "
          f"[{'PASS' if ref_ok else 'FAIL'}] -> {'PASS' if bw_ok and ref_ok else 'FAIL'}")
  return dict(mode=r["mode"], rows=r["rows"], pct_of_copy=r["pct_of_copy"], copy_method=r["copy_method"],
              bandwidth_pass=bw_ok,
              speedup_vs_reference=r["speedup_vs_reference"], speedup_pass=ref_ok, line=line,
              **{"pass": bw_ok and ref_ok})


def _plot(results, path):
  plt = pyplot()
  if plt is None:
    return
  fig, ax = plt.subplots(figsize=(7, 4))
  for mode in MODES:
    rs = [r for r in results if r["mode"] == mode]
    ax.plot([r["rows"] for r in rs], [r["pct_of_copy"] for r in rs], marker="o", label=mode)
  ax.axhline(80, color="gray", linestyle="--", linewidth=1)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("rows")
  ax.set_ylabel("% of D2D copy bandwidth")
  ax.set_title(f"rope_qdq on {jax.devices()[0].device_kind}")
  ax.legend()
  save(fig, path)


def _summaries(results):
  return [_summary(r) for r in results if r["rows"] >= TARGET_ROWS]


def _write_json(path, results, complete):
  """Writes the results so far (atomically: a run killed mid-write keeps the previous file)."""
  payload = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, complete=complete,
                 baseline="device-to-device copy of x (fastest of torch copy_ / XLA copy; see copy_method)",
                 torch_copy_note=_TORCH_NOTE, results=results, summary=_summaries(results))
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=2)
  os.replace(tmp, path)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="JSON results path (a PNG plot is written beside it)")
  parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
  parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
  parser.add_argument("--iters", type=int, default=20, help="steps per timed loop (fewer for huge arrays)")
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args(argv)
  if jax.devices()[0].platform != "gpu":
    sys.exit("rope_qdq benchmark needs an NVIDIA GPU (the Triton path)")

  results = []
  print(f"{'rows':>9} {'mode':<14} {'ours ms':>9} {'GB/s':>8} {'copy GB/s':>15} {'% copy':>7} "
        f"{'ref ms':>9} {'vs ref':>7}")
  for rows in (int(r) for r in args.rows.split(",")):
    for mode in args.modes.split(","):
      r = bench(mode, rows, args.iters, args.repeats)
      results.append(r)
      print(f"{rows:>9} {mode:<14} {r['ours_ms']:>9.4f} {r['ours_gbs']:>8.0f} {r['copy_gbs']:>8.0f} "
            f"{'(' + r['copy_method'] + ')':>6} {r['pct_of_copy']:>6.1f}% {r['reference_ms']:>9.4f} "
            f"{r['speedup_vs_reference']:>6.1f}x", flush=True)
      _write_json(args.out, results, complete=False)
  summary = _summaries(results)
  big = [r for r in results if r["rows"] >= TARGET_ROWS]
  if summary:
    print(f"per config (rows >= {TARGET_ROWS}; targets: >= {TARGET_PCT_OF_COPY:.0f}% of D2D copy bandwidth, "
          f">= {TARGET_SPEEDUP:.0f}x the reference):")
    for line in summary:
      print("  " + line["line"])
    print(f"rows >= 1M: min % of D2D copy {min(r['pct_of_copy'] for r in big):.1f} (target 80), "
          f"min speedup vs reference {min(r['speedup_vs_reference'] for r in big):.1f}x (target 3x); "
          f"{'ALL PASS' if all(x['pass'] for x in summary) else 'SOME FAIL'}")
  _write_json(args.out, results, complete=True)
  print(f"wrote {args.out}")
  _plot(results, os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
