"""A markdown table from a benchmark script's JSON output, for docs/BENCHMARKS.md.

  python benchmarks/report.py OUT.json [--command CMD] [--date YYYY-MM-DD] [--machine TEXT] [--software TEXT]
      [--rows 0,3]
  python benchmarks/report.py A.json B.json --labels a,b ...   (kernel_times.py runs side by side)

Knows the JSON of attention.py (its rows, or ``--memory-only``), masks.py, kernel_times.py, sharding.py,
rope_qdq.py, torch_rope_qdq.py, qat_matmul.py, compile_time.py, numerics_modes.py, decode.py, decode_gluon.py,
decode_read.py, quantize_pass.py, attention_ws.py and ncu_counters.py, by their keys. Prints a provenance line (the
command, date, machine and software given, plus the device the JSON names) and the table; times in ms unless a header
says otherwise.
``--rows`` keeps the rows of attention.py's JSON with those ``row`` indices. Nothing is computed that the JSON does
not hold, except ratios of two of its figures (and decode.py's share of the device's datasheet HBM bandwidth).
"""

from __future__ import annotations

import argparse
import json


def _num(v, digits=4):
  """``v`` with ``digits`` significant digits ("-" for a missing value)."""
  if v is None:
    return "-"
  if isinstance(v, bool):
    return "yes" if v else "no"
  if isinstance(v, int):
    return f"{v:,}" if abs(v) >= 100_000 else str(v)
  return f"{v:#.{digits}g}".rstrip(".") if abs(v) < 10 ** digits else f"{v:.0f}"


def _fixed(v, places=3):
  return "-" if v is None else f"{v:.{places}f}"


def _ratio(v):
  return "-" if v is None else f"{v:.2f}"


def _table(header, rows):
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return lines


def attention(d):
  """benchmarks/attention.py: one row per shape; columns without a figure in any row are left out."""
  cols = [("jqat fwd", "jqat_fwd_ms"), ("jqat fwd+bwd", "jqat_fwdbwd_ms"), ("jqat bwd", "jqat_bwd_ms"),
          ("cuDNN fwd", "cudnn_fwd_ms"), ("cuDNN fwd+bwd", "cudnn_fwdbwd_ms"), ("SDPA fwd", "sdpa_fwd_ms"),
          ("SDPA fwd+bwd", "sdpa_fwdbwd_ms"), ("FastVideo fwd", "fastvideo_fwd_ms"),
          ("FastVideo fwd+bwd", "fastvideo_fwdbwd_ms"), ("XLA reference fwd+bwd", "xla_ref_fwdbwd_ms")]
  cols = [c for c in cols if any(c[1] in r for r in d["rows"])]
  header = ["B, N, K, S, D, causal"] + [name for name, _ in cols] + ["fwd / cuDNN", "fwd+bwd / cuDNN"]
  rows = []
  for r in d["rows"]:
    shape = f"{r['B']}, {r['N']}, {r['K']}, {r['S']}, {r['D']}, {'yes' if r['causal'] else 'no'}"
    rows.append([shape] + [_num(r.get(key)) for _, key in cols]
                + [_ratio(r.get("ratio_fwd_vs_cudnn")), _ratio(r.get("ratio_fwdbwd_vs_cudnn"))])
  return _table(header, rows)


def memory(d):
  """benchmarks/attention.py --memory-only: the plans' prediction against the measured peak."""
  m = d["memory_check"]
  a = m["accounting"]
  s = a["shape"]
  mb = lambda v: "-" if v is None else f"{v / 1e6:.2f}"
  header = ["(B, N, S, D), causal", "inputs + outputs + residuals, MB", "predicted peak, MB", "measured peak, MB",
            "measured / (inputs + outputs + residuals)", "gradients finite"]
  ratio = m.get("measured_ratio")
  row = [f"({s['B']}, {s['N']}, {s['S']}, {s['D']}), {'yes' if s['causal'] else 'no'}", mb(a["base"]),
         mb(a["predicted_peak"]), mb(m.get("peak_bytes")), "-" if ratio is None else f"{ratio:.3f}x",
         _num(m.get("finite"))]
  return _table(header, [row])


def masks(d):
  """benchmarks/masks.py: forward, sum-loss fwd+bwd and given-dO fwd+bwd, each with its baseline and ratio."""
  kinds = ["fwd", "sum-loss fwd+bwd", "given-dO fwd+bwd"][: len(d["rows"][0]["ms"])]
  header = ["case", "baseline"] + [h for k in kinds for h in (k, "baseline", "ratio")]
  rows = []
  for r in d["rows"]:
    cells = [c for m, b, q in zip(r["ms"], r["baseline_ms"], r["ratio"]) for c in (_num(m), _num(b), _ratio(q))]
    rows.append([r["case"], r["baseline"]] + cells)
  return _table(header, rows)


# Kernel name fragments of benchmarks/kernel_times.py's groups, the warp-specialized kernels before the Triton ones
# whose names they contain (after the warp-specialized forward or dK/dV kernel, "attention_fwd" / "bwd_dkdv" is the
# Triton kernel's REDO launch).
KERNEL_GROUPS = ("attention_fwd_ws", "attention_fwd", "bwd_dkdv_ws", "bwd_dkdv", "bwd_dq", "bwd_delta", "fake_quantize",
                 "segments_sorted")


def kernel_group(name: str) -> str:
  """The group of a kernel ``name`` in kernel_times.py's tables: the first of KERNEL_GROUPS it contains, else its
  first 40 characters."""
  return next((key for key in KERNEL_GROUPS if key in name), name[:40])


def group_times(kernels: dict) -> dict:
  """``{kernel name: ms}`` summed by :func:`kernel_group`, in the order the groups first appear."""
  out = {}
  for name, t in kernels.items():
    group = kernel_group(name)
    out[group] = out.get(group, 0.0) + t
  return out


def kernel_times(d):
  """benchmarks/kernel_times.py: device ms per fwd+bwd of each kernel group, one column per case (grouped from the
  per-kernel times where the JSON has them)."""
  cases = list(d["cases"])
  by_case = {c: group_times(d["cases"][c]["kernels"]) if "kernels" in d["cases"][c] else d["cases"][c]["grouped"]
             for c in cases}
  groups = list(dict.fromkeys(g for c in cases for g in by_case[c]))
  ms = lambda v: "-" if v is None else f"{v:.3f}"
  label = lambda g: "torch elementwise kernels (gradient adds, fills)" if g.startswith("void at::") else g
  rows = [[label(g)] + [ms(by_case[c].get(g)) for c in cases] for g in groups]
  rows.append(["total"] + [ms(d["cases"][c]["total"]) for c in cases])
  return _table(["kernel"] + cases, rows)


def sharding(d):
  """benchmarks/sharding.py: fwd+bwd per configuration and its speed-up over one GPU."""
  header = ["B, T, N, D, causal", "config", "fwd+bwd", "speed-up vs 1 GPU", "target", "collectives"]
  rows = []
  for r in d["rows"]:
    coll = ", ".join(f"{n} {k}" for k, n in r.get("collectives", {}).items() if n) or "none"
    shape = f"{r['B']}, {r['T']}, {r['N']}, {r['D']}, {'yes' if r['causal'] else 'no'}"
    rows.append([shape, r["config"], _num(r.get("fwdbwd_ms")), _ratio(r.get("speedup_vs_1")),
                 r.get("target") or "", r.get("error", coll)])
  return _table(header, rows)


def rope_qdq(d):
  """benchmarks/rope_qdq.py: the JAX op against a device-to-device copy and the jitted reference."""
  header = ["mode", "rows", "ms", "GB/s", "copy GB/s", "% of copy", "reference ms", "speed-up vs reference"]
  rows = [[r["mode"], _num(r["rows"]), _num(r["ours_ms"]), _num(r["ours_gbs"]),
           f"{_num(r['copy_gbs'])} ({r['copy_method']})", f"{r['pct_of_copy']:.1f}%", _num(r["reference_ms"]),
           f"{r['speedup_vs_reference']:.1f}x"] for r in d["results"]]
  return _table(header, rows)


def torch_rope_qdq(d):
  """benchmarks/torch_rope_qdq.py: the in-place torch op against ``dst.copy_(x)`` in the same rounds."""
  header = ["mode", "width", "H", "rows", "ms", "copy ms", "share of a copy's speed", "HBM GB/s", "allocated +B"]
  rows = [[r["mode"], r["width"], r["heads"], _num(r["rows"]), _num(r["ours_ms"]), _num(r["copy_ms"]),
           f"{100 * r['copy_fraction']:.1f}%", _num(r["ours_hbm_gbs"]), r["allocated_delta"]] for r in d["results"]]
  return _table(header, rows)


def qat_matmul(d):
  """benchmarks/qat_matmul.py: the BF16 dot against qat_matmul (two quantize passes + the same dot), forward and
  forward + backward, and the passes' bandwidth against a copy's."""
  header = ["M, K, N", "BF16 dot", "qat_matmul", "ratio", "XLA path", "dot fwd+bwd", "qat fwd+bwd", "ratio",
            "fq(x) GB/s (copy)", "fq(w) GB/s (copy)"]
  rows = [[f"{r['M']}, {r['K']}, {r['N']}", _num(r["dot_ms"]), _num(r["qat_ms"]), _ratio(r["ratio_fwd"]),
           _num(r.get("xla_ms")), _num(r["dot_fwdbwd_ms"]), _num(r["qat_fwdbwd_ms"]), _ratio(r["ratio_fwdbwd"]),
           f"{r['fq_x_gbs']:.0f} ({r['copy_x_gbs']:.0f})", f"{r['fq_w_gbs']:.0f} ({r['copy_w_gbs']:.0f})"]
          for r in d["rows"]]
  return _table(header, rows)


# HBM bandwidth by the vendor's datasheets (SXM parts): benchmarks/decode.py's table, for JSON that predates its
# "hbm_tbps" key.
_HBM_TBPS = {"H100": 3.35, "H200": 4.8}


def _hbm(d) -> float | None:
  return d.get("hbm_tbps") or next((v for k, v in _HBM_TBPS.items() if k in d.get("device", "")), None)


def decode(d):
  """benchmarks/decode.py: decode over the packed cache against cuDNN BF16 decode and jqat.attention on a BF16 cache
  (their columns from the contiguous row of the same shape and Tq), the cache write, the split numerics; the read's
  share of the device's HBM bandwidth (datasheet)."""
  peak = _hbm(d)
  share = lambda tbps: f"{tbps:.2f}" + (f" ({100 * tbps / peak:.0f}%)" if peak else "")
  tbps_head = f"TB/s (of {peak or '?'})"
  header = ["B, N, K, T, D", "Tq", "layout", "splits", "jqat decode", tbps_head, "cuDNN BF16", "cuDNN / jqat",
            "jqat.attention", "write", "split vs 1", "1 vs exact"]
  key = lambda r: (r["B"], r["N"], r["K"], r["T"], r["D"], r["Tq"])
  # shape, Tq, layout: the leading cells of both tables
  lead = lambda r: [", ".join(map(str, key(r)[:5])), r["Tq"], f"paged {r['page_size']}" if r["paged"] else
                    "contiguous"]
  bf16 = {key(r): r for r in d["rows"] if not r["paged"]}
  rows = []
  for r in d["rows"]:
    c = bf16.get(key(r), {})
    cudnn, ms = c.get("cudnn_ms"), r["jqat_decode_ms"]
    rows.append([*lead(r), r["num_splits"], _num(ms), share(r["jqat_decode_tbps"]), _num(cudnn),
                 "-" if cudnn is None else f"{cudnn / ms:.2f}x", _num(c.get("jqat_attention_ms")),
                 _num(r["jqat_write_ms"]), f"{r['split_vs_one']:.1e}",
                 "-" if "one_vs_exact" not in r else f"{r['one_vs_exact']:.1e}"])
  lines = _table(header, rows)
  steps = [r for r in d["rows"] if "jqat_decode_step_ms" in r]
  if steps:  # the same calls as the layers of one jitted step: ms per layer
    lines += ["", f"Per layer of one jitted step of {d['step_layers']} layers (one dispatch from the host for all of "
              "them):", ""]
    step_rows = []
    for r in steps:
      cudnn, ms = bf16.get(key(r), {}).get("cudnn_step_ms"), r["jqat_decode_step_ms"]
      step_rows.append([*lead(r), _num(ms), share(r["packed_cache_bytes"] / ms / 1e9), _num(cudnn),
                        "-" if cudnn is None else f"{cudnn / ms:.2f}x"])
    lines += _table(header[:3] + ["jqat decode", tbps_head, "cuDNN BF16", "cuDNN / jqat"], step_rows)
  if d.get("sweep"):  # --sweep: the launch configurations, contiguous, Tq = 1
    lines += ["", "Launch configurations (`--sweep`, contiguous, Tq = 1):", ""]
    lines += _table(["B, N, K, T, D", "splits", "warps", "stages", "E4M3 conversion", "ms", "TB/s"],
                    [[f"{r['B']}, {r['N']}, {r['K']}, {r['T']}, {r['D']}", r["splits"], r["num_warps"], r["num_stages"],
                      _num(bool(r.get("cvt"))), _num(r.get("ms")), _fixed(r.get("tbps"), 2)]
                     for r in d["sweep"] if "ms" in r])
  return lines


def decode_gluon(d):
  """benchmarks/decode_gluon.py: the Gluon split kernel's variants against the Triton kernel: the check (O's distance
  from the Triton kernel's and from the oracle) and the times."""
  lines = []
  if d.get("check"):
    header = ["B, Tq, N, K, T, D", "splits", "layout", "causal", "p_scale", "variant", "vs Triton kernel",
              "elements differing", "vs oracle", "Triton kernel vs oracle", "within bound"]
    lines += _table(header, [[", ".join(map(str, r["case"][:6])), r["case"][6],
                              f"paged {r['case'][7]}" if r["case"][7] else "contiguous", _num(r["case"][8]),
                              r["case"][9], r["kernel"], f"{r['gluon_vs_triton']:.1e}", f"{r['differing']:.1e}",
                              "-" if r.get("gluon_vs_oracle") is None else f"{r['gluon_vs_oracle']:.2e}",
                              "-" if r.get("triton_vs_oracle") is None else f"{r['triton_vs_oracle']:.2e}",
                              _num(r["ok"])] for r in d["check"]])
  if d.get("time") and "triton_ms" not in d["time"][0]:  # --sweep: each variant at its split count
    rows = [[f"{r['B']}, {r['N']}, {r['K']}, {r['T']}, {r['D']}", r["Tq"],
             f"paged {r['page_size']}" if r["page_size"] else "contiguous", k[:-3].rsplit("_s", 1)[0],
             k[:-3].rsplit("_s", 1)[1], _num(v), _fixed(r[k[:-3] + "_tbps"], 2)]
            for r in d["time"] for k, v in r.items() if k.endswith("_ms")]
    lines += ([""] if lines else []) + _table(["B, N, K, T, D", "Tq", "layout", "variant", "splits", "ms", "TB/s"],
                                              rows)
  elif d.get("time"):
    variants = [k[:-3] for k in d["time"][0] if k.endswith("_ms") and k != "triton_ms"]
    header = (["B, N, K, T, D", "Tq", "layout", "splits", "Triton kernel"] + variants
              + [f"Triton / {v}" for v in variants] + [f"{v} TB/s" for v in variants])
    rows = []
    for r in d["time"]:
      rows.append([f"{r['B']}, {r['N']}, {r['K']}, {r['T']}, {r['D']}", r["Tq"],
                   f"paged {r['page_size']}" if r["page_size"] else "contiguous", r["splits"], _num(r["triton_ms"])]
                  + [_num(r[f"{v}_ms"]) for v in variants] + [_ratio(r["triton_ms"] / r[f"{v}_ms"]) for v in variants]
                  + [_fixed(r[f"{v}_tbps"], 2) for v in variants])
    lines += ([""] if lines else []) + _table(header, rows)
  if d.get("kernels"):  # --kernels: device time of each launch of the library's plan
    # --combine-warps: the combine launch with other warps a program, a column each
    warps = sorted({int(k[len("combine_w"):-len("_ms")]) for r in d["kernels"] for k in r
                    if k.startswith("combine_w")})
    header = (["B, N, K, T, D", "Tq", "splits", "split kernel", "split", "combine", "graph per call", "combine share"]
              + [f"combine, {w} warp{'s' * (w > 1)}" for w in warps])
    rows = []
    for r in d["kernels"]:
      gluon = "split_gluon_ms" in r
      split = r["split_gluon_ms" if gluon else "split_ms"]
      combine = r.get("combine_ms")
      rows.append([f"{r['B']}, {r['N']}, {r['K']}, {r['T']}, {r['D']}", r["Tq"], r["splits"],
                   "Gluon" if gluon else "Triton", _num(split), _num(combine), _num(r["graph_ms"]),
                   "-" if combine is None else f"{100 * combine / r['graph_ms']:.0f}%"]
                  + [_num(r.get(f"combine_w{w}_ms")) for w in warps])
    lines += ([""] if lines else []) + _table(header, rows)
  return lines


def decode_read(d):
  """benchmarks/decode_read.py: the packed cache's bytes read by access pattern, no arithmetic."""
  header = ["pattern", "scales too", "warps", "splits", "keys a step", "ms", "TB/s"]
  return _table(header, [[r["pattern"], _num(r["scales"]), r["warps"], r["splits"], r["rows"], _num(r["ms"]),
                          _fixed(r["tbps"], 2)] for r in d["rows"]])


def quantize_pass(d):
  """benchmarks/quantize_pass.py: the plans' quantize pass over Q, K, V against a device copy of the same bytes."""
  header = ["B, T, N, D", "MB read + written", "pass", "TB/s", "copy", "TB/s", "pass / copy"]
  return _table(header, [[", ".join(map(str, r["shape"])), f"{r['bytes'] / 1e6:.1f}", _num(r["pass_ms"]),
                          _fixed(r["pass_tbs"], 2), _num(r["copy_ms"]), _fixed(r["copy_tbs"], 2),
                          _ratio(r["pass_ms"] / r["copy_ms"])] for r in d["rows"]])


def compile_time(d):
  """benchmarks/compile_time.py: seconds from a new process to its first gradient, per cache state."""
  header = ["start", "first gradient, s", "of which the first run, s", "process, s", "kernels compiled",
            "XLA cache hits / misses"]
  rows = []
  for start in ("cold", "warm", "warm_kernel_cache_only"):
    if start in d:
      r = d[start]
      rows.append([start.replace("_", " "), f"{r['first_result_s']:.2f}", f"{r['phases_s']['first_run']:.2f}",
                   f"{r['process_wall_s']:.2f}", r["kernels_compiled_before_first_result"],
                   f"{r['xla_cache_hits']} / {r['xla_cache_misses']}"])
  return _table(header, rows)


def numerics_modes(d):
  """benchmarks/numerics_modes.py: time (the forward alone where the JSON has it, and fwd+bwd) and relative error
  against exact attention, per mode; "vs block": a row's time over the p_scale="block" row's of the same T, causal,
  smooth_k and qkv_scale."""
  block = {(r["t"], r["causal"], r["smooth_k"], r["qkv_scale"]): r for r in d["rows"] if r["p_scale"] == "block"}

  def vs_block(r, key):
    base = block.get((r["t"], r["causal"], r["smooth_k"], r["qkv_scale"]), {}).get(key)
    return _ratio(r[key] / base) if base and r.get(key) else "-"

  keys = [k for k in ("fwd_ms", "fwd_bwd_ms") if any(k in r for r in d["rows"])]
  names = {"fwd_ms": "fwd", "fwd_bwd_ms": "fwd+bwd"}
  header = (["T", "causal", "p_scale", "smooth_k", "qkv_scale"]
            + [h for k in keys for h in (names[k], f"{names[k]} vs block")] + ["O", "dQ", "dK", "dV"])
  rows = [[r["t"], _num(r["causal"]), r["p_scale"], _num(r["smooth_k"]), r["qkv_scale"]]
          + [c for k in keys for c in (_num(r.get(k)), vs_block(r, k))]
          + [_fixed(r.get(f"err_{x}")) for x in ("o", "dq", "dk", "dv")] for r in d["rows"]]
  return _table(header, rows)


def _by_variant(rows):
  """``{variant: its rows}`` in the order the variants first appear."""
  return {n: [r for r in rows if r["variant"] == n] for n in dict.fromkeys(r["variant"] for r in rows)}


def attention_ws(d):
  """benchmarks/attention_ws.py: the check (the warp-specialized kernel's O against the Triton forward's and the
  float64 oracle, worst case per variant) and the times of its variants against the Triton forward and cuDNN."""
  lines = []
  if d.get("check"):
    # Per variant and p_scale (older runs: block mode alone). The training variant (``_residuals``) is compared with
    # the Triton training forward's O', lse (and in row mode the row max) as well; row mode has no oracle here.
    per = _by_variant([dict(r, variant=(r["variant"], r.get("p_scale", "block"))) for r in d["check"]])
    worst = lambda rs, key, fmt=".1e": (f"{max(r[key] for r in rs if key in r):{fmt}}" if any(key in r for r in rs)
                                        else "-")
    lines += _table(["variant", "p_scale", "cases", "largest share of O elements differing from the Triton forward",
                     "of O'", "of lse", "of the row max", "largest distance from the oracle", "the Triton forward's",
                     "all within bound"],
                    [[n, p, len(rs), worst(rs, "differing"), worst(rs, "differing_o_hp"), worst(rs, "differing_lse"),
                      worst(rs, "differing_row_max"), worst(rs, "ws_vs_oracle", ".2e"),
                      worst(rs, "triton_vs_oracle", ".2e"), _num(all(r["ok"] for r in rs))]
                     for (n, p), rs in per.items()])
  if d.get("time"):
    variants = list(dict.fromkeys(k[:-3] for r in d["time"] for k in r
                                  if k.endswith("_ms") and k not in ("triton_ms", "cudnn_bf16_ms")))
    header = (["B, H, K, T, D, causal", "Triton forward", "cuDNN BF16"] + variants
              + [f"Triton / {v}" for v in variants] + [f"{v} / cuDNN" for v in variants])
    rows = []
    for r in d["time"]:
      ms = [r.get(f"{v}_ms") for v in variants]
      rows.append([f"{r['B']}, {r['H']}, {r['K']}, {r['T']}, {r['D']}, {_num(r['causal'])}", _num(r["triton_ms"]),
                   _num(r.get("cudnn_bf16_ms"))] + [_num(m) for m in ms]
                  + [_ratio(r["triton_ms"] / m) if m else "-" for m in ms]
                  + [_ratio(m / r["cudnn_bf16_ms"]) if m and r.get("cudnn_bf16_ms") else "-" for m in ms])
    lines += ([""] if lines else []) + _table(header, rows)
  return lines


def attention_ws_bwd(d):
  """benchmarks/attention_ws_bwd.py: the check (the warp-specialized dK/dV kernel's dK and dV against the Triton
  kernel's and the float64 oracle, worst case per variant) and the kernels' times against the Triton dK/dV launch."""
  lines = []
  if d.get("check"):
    per = _by_variant(d["check"])
    worst = lambda rs, key: max(max(r[f"dk_{key}"], r[f"dv_{key}"]) for r in rs)
    lines += _table(["variant", "cases", "largest share of dK, dV elements differing from the Triton kernel's",
                     "largest distance from the oracle", "the Triton kernel's", "all within bound"],
                    [[n, len(rs), f"{worst(rs, 'differing'):.1e}", f"{worst(rs, 'vs_oracle'):.2e}",
                      f"{max(max(r['triton_dk_vs_oracle'], r['triton_dv_vs_oracle']) for r in rs):.2e}",
                      _num(all(r["ok"] for r in rs))] for n, rs in per.items()])
  if d.get("time"):
    variants = list(dict.fromkeys(k[:-3] for r in d["time"] for k in r if k.endswith("_ms") and k != "triton_ms"))
    header = (["B, H, K, T, D", "Triton dK/dV"] + variants + [f"Triton / {v}" for v in variants]
              + ["every variant's dK, dV equal to the Triton kernel's"])
    rows = []
    for r in d["time"]:
      ms = [r.get(f"{v}_ms") for v in variants]
      same = all(r.get(f"{v}_bitwise") for v in variants)
      rows.append([f"{r['B']}, {r['H']}, {r['K']}, {r['T']}, {r['D']}", _num(r["triton_ms"])] + [_num(m) for m in ms]
                  + [_ratio(r["triton_ms"] / m) if m else "-" for m in ms] + [_num(same)])
    lines += ([""] if lines else []) + _table(header, rows)
  return lines


# ncu_counters.py: the per-launch columns, each (header, ncu's row name, decimals; None: 4 significant digits); the
# three largest stall reasons follow.
NCU_COLUMNS = [("ms", "Duration", None), ("registers", "Registers Per Thread", 0),
               ("warps / SM", "Achieved Active Warps Per SM", 1), ("issue slots busy %", "Issue Slots Busy", 1),
               ("tensor pipe %", "Tensor (All)", 1), ("ALU %", "ALU", 1), ("FMA %", "FMA", 1), ("XU %", "XU", 1),
               ("DRAM %", "DRAM Throughput", 1),
               ("cycles / issued instruction", "Warp Cycles Per Issued Instruction", 2)]


def ncu_counters(d):
  rows = []
  for r in d["rows"]:
    m = r["metrics"]
    stalls = sorted(((v, k[len("Stall "):]) for k, v in m.items() if k.startswith("Stall ")), reverse=True)[:3]
    grid = "x".join(map(str, r["grid"])) + " of " + str(r["block"][0] * r["block"][1] * r["block"][2])
    launches = f" ({r['launches']} launches)" if r.get("launches", 1) > 1 else ""
    cells = (_num(m.get(key)) if places is None else _fixed(m.get(key), places) for _, key, places in NCU_COLUMNS)
    rows.append([r["label"], f"`{r['kernel']}`{launches}", grid, *cells,
                 ", ".join(f"{name.lower()} {v:.2f}" for v, name in stalls) or "-"])
  return _table(["case", "kernel", "grid of threads", *(h for h, _, _ in NCU_COLUMNS),
                 "largest stalls (cycles / issued instruction)"], rows)


def kind(d):
  """Which script wrote ``d``."""
  rows = d.get("rows") or [{}]
  results = d.get("results") or [{}]
  for name, test in [("memory", "memory_check" in d and "rows" not in d), ("attention", "jqat_fwd_ms" in rows[0]),
                     ("masks", "baseline_ms" in rows[0]), ("kernel_times", "cases" in d),
                     ("sharding", "speedup_vs_1" in rows[0] or "config" in rows[0]),
                     ("qat_matmul", "qat_fwdbwd_ms" in rows[0]), ("numerics_modes", "err_dv" in rows[0]),
                     ("decode", "jqat_decode_ms" in rows[0]),
                     ("decode_gluon", str(d.get("benchmark", "")).startswith("decode_gluon")),
                     ("decode_read", d.get("benchmark") == "decode_read"),
                     ("quantize_pass", d.get("benchmark") == "quantize_pass"),
                     ("attention_ws", d.get("benchmark") == "attention_ws"),
                     ("attention_ws_bwd", d.get("benchmark") == "attention_ws_bwd"),
                     ("ncu_counters", d.get("benchmark") == "ncu_counters"),
                     ("torch_rope_qdq", "copy_fraction" in results[0]),
                     ("rope_qdq", "speedup_vs_reference" in results[0]), ("compile_time", "warm" in d)]:
    if test:
      return name
  raise ValueError("not the JSON of a known benchmark script")


RENDER = dict(attention=attention, memory=memory, masks=masks, kernel_times=kernel_times, sharding=sharding,
              rope_qdq=rope_qdq, torch_rope_qdq=torch_rope_qdq, qat_matmul=qat_matmul, compile_time=compile_time,
              numerics_modes=numerics_modes, decode=decode, decode_gluon=decode_gluon,
              decode_read=decode_read, quantize_pass=quantize_pass, attention_ws=attention_ws,
              attention_ws_bwd=attention_ws_bwd, ncu_counters=ncu_counters)


def report(d, command=None, date=None, machine=None, software=None, rows=None):
  """The markdown lines for the JSON object ``d``: a provenance line, a blank line and the table; ``rows``: the
  attention rows to keep (their ``row`` indices), all when None."""
  if rows is not None:
    d = dict(d, rows=[r for r in d["rows"] if r.get("row") in rows])
  device = d.get("device")
  named = device and not (machine and str(device) in machine)
  prov = [f"`{command}`" if command else None, date, machine, f"device {device}" if named else None, software]
  lines = ["; ".join(p for p in prov if p) + "." if any(prov) else None, ""]
  return [x for x in lines if x is not None] + RENDER[kind(d)](d)


def merge_kernel_times(parts: list[dict], labels: list[str]) -> dict:
  """Several kernel_times.py JSONs as one, each one's cases labelled ``"case (label)"`` (one column each): runs of
  one shape in separate processes, such as one per ``JQAT_ATTN_FWD_KERNEL``."""
  if len(labels) != len(parts):
    raise ValueError(f"{len(parts)} JSONs take {len(parts)} labels, got {len(labels)}")
  if any(kind(d) != "kernel_times" for d in parts):
    raise ValueError("only kernel_times.py JSONs are merged")
  devices = {d.get("device") for d in parts}
  if len(devices) > 1:
    raise ValueError(f"runs of one device only, got {sorted(map(str, devices))}")
  cases = {f"{case} ({label})": row for d, label in zip(parts, labels) for case, row in d["cases"].items()}
  return {"device": devices.pop(), "cases": cases}  # each run's shape is its label's to name


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("json", nargs="+", help="one JSON, or several kernel_times.py JSONs (with --labels)")
  ap.add_argument("--labels", help="kernel_times.py: a comma-separated label per JSON, for its columns")
  ap.add_argument("--command", help="the command line that wrote the JSON")
  ap.add_argument("--date")
  ap.add_argument("--machine", help='e.g. "one NVIDIA H200"')
  ap.add_argument("--software", help='e.g. "jax 0.11.2, triton 3.6.0, jax-triton 0.3.1"')
  ap.add_argument("--rows", help="attention.py rows to keep: comma-separated row indices")
  args = ap.parse_args()
  parts = []
  for path in args.json:
    with open(path) as f:
      parts.append(json.load(f))
  d = parts[0] if len(parts) == 1 and not args.labels else merge_kernel_times(parts, (args.labels or "").split(","))
  rows = None if args.rows is None else {int(x) for x in args.rows.split(",")}
  print("\n".join(report(d, args.command, args.date, args.machine, args.software, rows)))


if __name__ == "__main__":
  main()
