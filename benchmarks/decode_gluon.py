"""The Gluon decode kernel against the Triton kernel (one GPU, torch): the same outputs, and the time of each.

    python benchmarks/decode_gluon.py --out decode_gluon.json [--check-only | --time-only] [--compile-only] [--sweep]
        [--caps] [--kernels [--combine-warps 1,2]]

Check: random packed caches (every code byte, E4M3 scales over 2**-9 .. 2**3, some subnormal) and BF16 queries, GQA,
ragged lengths, contiguous and paged, causal and not, one split and several, p_scale "block" and "row"; per case the
relative (Frobenius) distance of the Gluon kernel's O from the Triton kernel's and the share of elements that differ,
and where the case is small, the distance of each from the float64 oracle (tests/oracle.py) against the decode tests'
bound. Time: the split (and combine) launches of each kernel on full caches, caches cycled over at least 512 MB so
that no launch finds its cache in the L2; CUDA events around the replay of a CUDA graph of 40 calls, median of 7
replays; TB/s counts the packed cache bytes read. ``--compile-only`` builds every case's Gluon launch for sm_90
without a GPU. ``--kernels``: the library's plan (the split kernel it chooses, the combine) at decode.py's shapes, the
device time per call of each launch under ``torch.profiler`` beside the CUDA graph's time per call;
``--combine-warps`` adds the combine launch's time with other warps a program than the plan's 4.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
from _timing import graph_replay_ms, kernel_device_ms

from jqat.ffi import plan as plans
from jqat.ffi.options import DecodeOptions, default_num_splits

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

O_BOUND = 2e-2  # tests/test_decode.py

# (B, Tq, N, K, T, D, splits, page size or 0, causal, p_scale)
CHECKS = [
    (4, 1, 32, 8, 4096, 128, 8, 0, True, "block"),
    (4, 1, 32, 8, 4096, 128, 8, 64, True, "block"),
    (3, 1, 8, 1, 3008, 128, 5, 64, True, "block"),
    (2, 4, 16, 4, 2048, 128, 4, 128, True, "block"),
    (2, 2, 32, 8, 1024, 128, 1, 0, True, "block"),
    (2, 3, 16, 8, 2048, 64, 3, 0, True, "block"),
    (2, 1, 16, 2, 1536, 64, 2, 64, False, "block"),
    (3, 1, 32, 8, 4096, 128, 8, 0, True, "row"),
    (2, 8, 4, 2, 1024, 128, 2, 0, True, "block"),
    (2, 16, 8, 8, 512, 64, 1, 0, False, "row"),
    (2, 4, 8, 8, 2048, 64, 3, 64, True, "block"),
    (3, 2, 16, 8, 1536, 128, 1, 0, True, "row"),
]
# (B, N, K, T, D, Tq, page size)
TIMES = [
    (8, 32, 8, 32768, 128, 1, 0),
    (8, 32, 8, 32768, 128, 1, 64),
    (8, 32, 8, 32768, 128, 4, 0),
    (64, 8, 1, 4096, 128, 1, 0),
    (32, 32, 8, 8192, 128, 1, 0),
    (1, 32, 8, 131072, 128, 1, 0),
    (8, 32, 8, 32768, 64, 1, 0),
]


# --sweep: (B, N, K, T, D, Tq, page size) -> the (variant, splits) pairs timed, the default first: the KV heads a
# program takes and its stages at every timed shape with more than one KV head, the default's copies alone and compute
# alone, and split counts beside the default at T = 131072 (whose runs are 16 tiles long).
_KG = [("gluon_kg2_stages2", None), ("gluon_kg4_stages2", None), ("gluon_kg2_stages3", None)]
SWEEP = {
    (8, 32, 8, 32768, 128, 1, 0): _KG + [("gluon_kg1_stages3", None), ("gluon_memonly", None),
                                         ("gluon_computeonly", None)],
    (8, 32, 8, 32768, 128, 1, 64): _KG,
    (8, 32, 8, 32768, 128, 4, 0): _KG,
    (32, 32, 8, 8192, 128, 1, 0): _KG,
    (32, 32, 8, 8192, 128, 4, 0): _KG,
    (1, 32, 8, 131072, 128, 1, 0): _KG + [("gluon_kg2_stages2", 64), ("gluon_kg2_stages3", 64)],
    (1, 32, 8, 131072, 128, 4, 0): _KG,
    (8, 32, 8, 32768, 64, 1, 0): _KG,
}
# --caps: register caps (decode_gluon.MAXNREG) that fit more programs on an SM, the uncapped default first. Offline
# (sm_90): one new token at D = 128 takes 193 registers (5 two-warp programs an SM; 168 fits 6 with 24 B spilled), four
# new tokens 254 (4 programs; 232 spills nothing but fits no more, 200 fits 5 with 104 B spilled, 168 fits 6 with 248
# B), D = 64 152 (6 programs; 128 fits 8, no spill). With them the compute alone (PROBE 2) at T = 32768, uncapped and
# capped: on an H100 one new token is bound by the copies there, and an H200 reads 1.43x faster.
_CAPS1 = [("gluon_reg0", None), ("gluon_reg168", None)]
_CAPS4 = [("gluon_reg0", None), ("gluon_reg232", None), ("gluon_reg200", None), ("gluon_reg168", None)]
CAPS = {
    (8, 32, 8, 32768, 128, 1, 0): _CAPS1 + [("gluon_reg0_computeonly", None), ("gluon_reg168_computeonly", None)],
    (8, 32, 8, 32768, 128, 4, 0): _CAPS4 + [("gluon_reg0_computeonly", None), ("gluon_reg200_computeonly", None),
                                            ("gluon_reg0_memonly", None)],
    (32, 32, 8, 8192, 128, 4, 0): _CAPS4,
    (1, 32, 8, 131072, 128, 1, 0): _CAPS1,
    (1, 32, 8, 131072, 128, 4, 0): _CAPS4,
    (8, 32, 8, 32768, 64, 1, 0): [("gluon_reg0", None), ("gluon_reg128", None)],
}
# --kernels: decode.py's shapes, contiguous, one and four new tokens (B, N, K, T, D, Tq, page size); the plan's own
# choice of split kernel (the Triton one for the 32 query rows of (64, 8, 1, 4096) with four).
KERNEL_ROWS = [(b, n, kh, t, 128, tq, 0) for b, n, kh, t in ((8, 32, 8, 32768), (32, 32, 8, 8192), (1, 32, 8, 131072),
                                                              (64, 8, 1, 4096)) for tq in (1, 4)]


def describe(shape, dtype):
  return plans.Tensor.dense(shape, dtype)


# Gluon launch parameters measured beside the default (decode_gluon.stages): two and three stages.
VARIANTS = {"gluon": None, "gluon_stages2": 2, "gluon_stages3": 3}
# --sweep's and --caps' variants: the module knobs of decode_gluon (STAGES, KV_GROUP, PROBE, PACK, MAXNREG) they set,
# by name: gluon[_kg<G>][_stages<S>][_reg<R>][_nopack][_memonly | _computeonly] (a cap of R registers a thread, 0
# for none; S^T not packed; the copies alone, the compute alone).
PROBES = {"gluon_memonly": 1, "gluon_computeonly": 2}


def _knobs(kernel: str) -> dict:
  knobs = {"STAGES": VARIANTS.get(kernel), "KV_GROUP": None, "PROBE": 0, "PACK": True, "MAXNREG": 0}
  for part in kernel.split("_")[1:]:
    if part.startswith("reg"):
      knobs["MAXNREG"] = int(part[3:])
    elif part == "nopack":
      knobs["PACK"] = False
    elif part.startswith("kg"):
      knobs["KV_GROUP"] = int(part[2:])
    elif part.startswith("stages"):
      knobs["STAGES"] = int(part[6:])
    elif "gluon_" + part in PROBES:
      knobs["PROBE"] = PROBES["gluon_" + part]
  return knobs


def make_plan(b, tq, n, kh, t, d, splits, page, causal, p_scale, kernel, target):
  """The plan of one case; ``kernel`` "triton" or a Gluon variant (VARIANTS, or a --sweep name: :func:`_knobs`)."""
  from jqat.kernels_triton import decode_gluon

  knobs = _knobs(kernel) if kernel != "triton" else {}
  saved = {k: getattr(decode_gluon, k) for k in knobs}
  for k, v in knobs.items():
    setattr(decode_gluon, k, v)
  try:
    return _make_plan(b, tq, n, kh, t, d, splits, page, causal, p_scale, "triton" if kernel == "triton" else "gluon",
                      target)
  finally:
    for k, v in saved.items():
      setattr(decode_gluon, k, v)


def _make_plan(b, tq, n, kh, t, d, splits, page, causal, p_scale, kernel, target):
  q = describe((b, tq, n, d), "bfloat16")
  lead = (b * t // page + 1, page) if page else (b, t)
  kc, ks = describe(lead + (kh, d // 2), "uint8"), describe(lead + (kh, d // 16), "float8_e4m3fn")
  table = describe((b, t // page), "int32") if page else None
  opts = DecodeOptions(scale=d ** -0.5, is_causal=causal, num_splits=splits, p_scale=p_scale)
  return plans.decode_attention(q, kc, ks, kc, ks, describe((b,), "int32"), opts, target, page_table=table,
                                kernel=kernel)


def compile_only():
  from jqat.ffi import callback_launch

  target = plans.Target((9, 0))
  cases = [c for c in CHECKS] + [(b, tq, n, kh, t, d, default_num_splits(b, kh, t, 64), page, True, "block")
                                  for b, n, kh, t, d, tq, page in TIMES]
  for case in cases:
    plan = make_plan(*case, "gluon", target)
    launch = plan.launches[0]
    types = [("*" + callback_launch._POINTER_TYPES[plan.buffers[a.name].dtype]) if isinstance(a, plans.Ref)
             else "fp32" if isinstance(a, float) else "i32" for a in launch.args]
    types += ["*" + callback_launch._POINTER_TYPES[plan.buffers[o].dtype] for o in launch.outputs]
    k = callback_launch.build(launch.kernel, tuple(types), (), tuple(launch.constexprs.items()), launch.num_warps,
                              launch.num_stages, (9, 0))
    from sass_stats import sass_stats

    st = sass_stats(k)
    loop = max(st["loops"], key=lambda x: x["instructions"])["instructions"] if st["loops"] else 0
    print(case, f"registers {st['registers']}, stack {st['stack_bytes']} B, shared {st['shared_bytes']} B, KV loop "
          f"{loop} instructions", flush=True)


def random_cache(b, t, kh, d, page, seed, device):
  """Codes (every byte value) and E4M3 scales (2**-9 .. 2**3, one in 32 subnormal) of K and V, and a shuffled page
  table; as torch tensors, drawn on ``device``."""
  import torch

  g = torch.Generator(device=device).manual_seed(seed)
  lead = (b * t // page + 1, page) if page else (b, t)
  draw = lambda lo, hi, shape: torch.randint(lo, hi, shape, generator=g, device=device, dtype=torch.int32)

  def scales():
    shape = lead + (kh, d // 16)
    byte = (draw(1, 11, shape) << 3) | draw(0, 8, shape)
    byte = torch.where(draw(0, 32, shape) == 0, draw(1, 8, shape), byte)
    return byte.to(torch.uint8).view(torch.float8_e4m3fn)

  codes = lambda: draw(0, 256, lead + (kh, d // 2)).to(torch.uint8)
  table = None
  if page:
    table = (torch.randperm(b * t // page, generator=g, device=device) + 1).reshape(b, t // page).to(torch.int32)
  return (codes(), scales()), (codes(), scales()), table


def run_plan(plan, q, kc, vc, lengths, table):
  import torch

  from jqat.ffi import torch_launch

  tensors = dict(q=q, k_codes=kc[0], k_scales=kc[1], v_codes=vc[0], v_scales=vc[1], kv_len=lengths)
  if table is not None:
    tensors["page_table"] = table
  tensors.update(torch_launch.allocate(plan, plan.scratch + ("o",), q.device))
  torch_launch.execute(plan, tensors)
  torch.cuda.synchronize()
  return tensors["o"]


def oracle_values(cache, table, b, t):
  from oracle import unpack_oracle

  codes, scales = cache[0].cpu().numpy(), cache[1].view(__import__("torch").uint8).cpu().numpy()
  if table is not None:
    tb = table.cpu().numpy()
    codes = codes[tb].reshape((b, t) + codes.shape[2:])
    scales = scales[tb].reshape((b, t) + scales.shape[2:])
  return unpack_oracle(codes, scales)


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(results, variants=("gluon",)):
  import torch

  target = plans.Target(tuple(torch.cuda.get_device_capability()))
  for i, (b, tq, n, kh, t, d, splits, page, causal, p_scale) in enumerate(CHECKS):
    kc, vc, table = random_cache(b, t, kh, d, page, 10 + i, "cuda")
    q = torch.randn(b, tq, n, d, generator=torch.Generator().manual_seed(i), dtype=torch.float32).to(torch.bfloat16)
    q = q.cuda()
    lengths = torch.from_numpy(np.random.default_rng(i).integers(tq, t + 1, b).astype(np.int32))
    lengths[0] = t
    lengths = lengths.cuda()
    outs = {}
    for kernel in ("triton", *variants):
      plan = make_plan(b, tq, n, kh, t, d, splits, page, causal, p_scale, kernel, target)
      assert plan.launches[0].name.endswith("gluon") == (kernel != "triton")
      outs[kernel] = run_plan(plan, q, kc, vc, lengths, table).float().cpu().numpy()
    want = None
    if p_scale == "block" and b * n * t <= 2 ** 20:
      from oracle import decode_oracle

      want = decode_oracle(q.float().cpu().numpy(), oracle_values(kc, table, b, t), oracle_values(vc, table, b, t),
                           lengths.cpu().numpy(), scale=d ** -0.5, block_n=64, num_splits=splits, is_causal=causal)
    tr = outs["triton"]
    for kernel in variants:
      g = outs[kernel]
      row = dict(case=[b, tq, n, kh, t, d, splits, page, causal, p_scale], kernel=kernel,
                 finite=bool(np.isfinite(g).all()), gluon_vs_triton=rel(g, tr), differing=float((g != tr).mean()),
                 max_abs=float(np.abs(g - tr).max()))
      if want is not None:
        row.update(gluon_vs_oracle=rel(g, want), triton_vs_oracle=rel(tr, want))
        row["ok"] = row["finite"] and row["gluon_vs_oracle"] < O_BOUND
      else:
        row["ok"] = row["finite"] and row["gluon_vs_triton"] < 1e-2
      results["check"].append(row)
      print(json.dumps(row), flush=True)


def _timing_case(b, n, kh, t, d, tq, page, copies_bytes):
  """The inputs of a timed case: ``(target, caches, q, lengths, row)``, ``caches`` random copies of at least
  ``copies_bytes`` in all (no call finds its cache in the L2), ``row`` the case's JSON fields so far."""
  import torch

  target = plans.Target(tuple(torch.cuda.get_device_capability()))
  packed = b * t * kh * (d // 2 + d // 16) * 2
  copies = max(2, math.ceil(copies_bytes / packed))
  caches = [random_cache(b, t, kh, d, page, 100 + c, "cuda") for c in range(copies)]
  q = torch.randn(b, tq, n, d, device="cuda", dtype=torch.bfloat16)
  lengths = torch.full((b,), t, dtype=torch.int32, device="cuda")
  row = dict(B=b, N=n, K=kh, T=t, D=d, Tq=tq, page_size=page, splits=default_num_splits(b, kh, t, 64),
             cache_bytes=packed)
  return target, caches, q, lengths, row


def _tensor_sets(plan, caches, q, lengths):
  """One tensor set of ``plan`` per cache copy (its scratch and output allocated)."""
  from jqat.ffi import torch_launch

  sets = []
  for kc, vc, table in caches:
    tensors = dict(q=q, k_codes=kc[0], k_scales=kc[1], v_codes=vc[0], v_scales=vc[1], kv_len=lengths)
    if table is not None:
      tensors["page_table"] = table
    tensors.update(torch_launch.allocate(plan, plan.scratch + ("o",), q.device))
    sets.append(tensors)
  return sets


def time_case(b, n, kh, t, d, tq, page, kernels=("triton", *VARIANTS), copies_bytes=512 << 20, split_counts=None):
  """Times of each kernel at the default splits (keys ``{kernel}_ms``) and of each ``(kernel, splits)`` pair of
  ``split_counts`` (keys ``{kernel}_s{splits}_ms``; splits None: the default)."""
  from jqat.ffi import torch_launch

  target, caches, q, lengths, row = _timing_case(b, n, kh, t, d, tq, page, copies_bytes)
  splits = row["splits"]
  runs = [(kernel, splits, kernel) for kernel in kernels]
  runs += [(kernel, s or splits, f"{kernel}_s{s or splits}") for kernel, s in split_counts or ()]  # None: default
  for kernel, splits, name in runs:
    plan = make_plan(b, tq, n, kh, t, d, splits, page, True, "block", kernel, target)
    sets = _tensor_sets(plan, caches, q, lengths)
    for s in sets:  # compiles
      torch_launch.execute(plan, s)
    # A CUDA graph of 40 calls cycling through the copies: the replay times the kernels, not Python's launches.
    ms = graph_replay_ms(lambda i, plan=plan, sets=sets: torch_launch.execute(plan, sets[i % len(sets)]))
    row[f"{name}_ms"] = ms
    row[f"{name}_tbps"] = row["cache_bytes"] / ms / 1e9
  if "triton_ms" in row and "gluon_ms" in row:
    row["speedup"] = row["triton_ms"] / row["gluon_ms"]
  print(json.dumps(row), flush=True)
  return row


def kernel_times(b, n, kh, t, d, tq, page, copies_bytes=512 << 20, calls=40, combine_warps=()):
  """Device ms per call of each launch of the library's plan (keys ``split_gluon_ms`` or ``split_ms``, and
  ``combine_ms``) and the CUDA graph's ms per call (``graph_ms``); for each of ``combine_warps`` the combine
  launch's device ms with that many warps instead of the plan's (``combine_w<N>_ms``)."""
  import dataclasses

  from jqat.ffi import torch_launch

  target, caches, q, lengths, row = _timing_case(b, n, kh, t, d, tq, page, copies_bytes)
  plan = _make_plan(b, tq, n, kh, t, d, row["splits"], page, True, "block", None, target)  # the library's choice
  sets = _tensor_sets(plan, caches, q, lengths)

  def call(i):
    torch_launch.execute(plan, sets[i % len(sets)])

  row["graph_ms"] = graph_replay_ms(call)
  for kernel, ms in kernel_device_ms(call, calls).items():  # the plan's launches by their kernels' names
    for launch in plan.launches:
      if launch.kernel.__name__ in kernel:
        row[launch.name.removeprefix("jqat_decode_") + "_ms"] = ms
  for warps in combine_warps:
    launches = tuple(dataclasses.replace(la, num_warps=warps) if la.name == "jqat_decode_combine" else la
                     for la in plan.launches)
    if launches == plan.launches:  # one split: no combine
      break
    other = dataclasses.replace(plan, launches=launches)
    times = kernel_device_ms(lambda i, other=other: torch_launch.execute(other, sets[i % len(sets)]), calls)
    row[f"combine_w{warps}_ms"] = next(ms for kernel, ms in times.items() if "decode_combine" in kernel)
  print(json.dumps(row), flush=True)
  return row


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="decode_gluon.json")
  ap.add_argument("--check-only", action="store_true")
  ap.add_argument("--time-only", action="store_true")
  ap.add_argument("--compile-only", action="store_true")
  ap.add_argument("--choice", default=None, help="write there the environment of the variant the tests should run")
  ap.add_argument("--sweep", action="store_true", help="time the variants and split counts of SWEEP only")
  ap.add_argument("--caps", action="store_true", help="time the register caps of CAPS only")
  ap.add_argument("--kernels", action="store_true", help="device time of each launch at KERNEL_ROWS only")
  ap.add_argument("--combine-warps", default="",
                  help="with --kernels: also the combine launch with these warps a program (comma-separated)")
  ap.add_argument("--variants", default="gluon", help="the Gluon variants the check compares, comma-separated")
  args = ap.parse_args()
  if args.compile_only:
    compile_only()
    return
  import torch

  if args.kernels:
    rows = []
    for case in KERNEL_ROWS:  # the file after every row: a run cut short keeps what it measured
      rows.append(kernel_times(*case, combine_warps=[int(w) for w in args.combine_warps.split(",") if w]))
      with open(args.out, "w") as f:
        json.dump({"benchmark": "decode_gluon --kernels", "date": time.strftime("%Y-%m-%d"),
                   "device": torch.cuda.get_device_name(), "kernels": rows}, f, indent=1)
    return
  if args.sweep or args.caps:
    rows = [time_case(*case, kernels=(), split_counts=runs) for case, runs in (CAPS if args.caps else SWEEP).items()]
    with open(args.out, "w") as f:
      json.dump({"benchmark": "decode_gluon --caps" if args.caps else "decode_gluon --sweep",
                 "date": time.strftime("%Y-%m-%d"),
                 "device": torch.cuda.get_device_name(), "time": rows}, f, indent=1)
    for r in rows:
      print(r["B"], r["N"], r["K"], r["T"], r["D"], r["Tq"], " ".join(
          f"{k[:-3]} {v:.4f}" for k, v in r.items() if k.endswith("_ms")))
    return

  results = {"benchmark": "decode_gluon", "command": " ".join(["python benchmarks/decode_gluon.py"] + sys.argv[1:]),
             "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "check": [], "time": []}
  try:
    if not args.time_only:
      check(results, tuple(args.variants.split(",")))
    if not args.check_only:
      for case in TIMES:
        results["time"].append(time_case(*case))
  finally:
    with open(args.out, "w") as f:
      json.dump(results, f, indent=1)
  print("case | kernel | gluon vs triton | differing | gluon vs oracle | triton vs oracle | ok")
  for r in results["check"]:
    print(r["case"], r["kernel"], f"{r['gluon_vs_triton']:.2e}", f"{r['differing']:.5f}", r.get("gluon_vs_oracle"),
          r.get("triton_vs_oracle"), r["ok"])
  print("B, N, K, T, D, Tq, page | triton ms | " + " | ".join(f"{v} ms" for v in VARIANTS) + " | speedup | TB/s")
  for r in results["time"]:
    print(r["B"], r["N"], r["K"], r["T"], r["D"], r["Tq"], r["page_size"], f"{r['triton_ms']:.4f}",
          *(f"{r[v + '_ms']:.4f}" for v in VARIANTS), f"{r['speedup']:.2f}x", f"{r['gluon_tbps']:.2f}")
  ok = {v: all(r["ok"] for r in results["check"] if r["kernel"] == v) for v in dict.fromkeys(
      r["kernel"] for r in results["check"])}
  print("all checks ok:", ok)
  if args.choice:  # the environment of the variant to test further: the default where it passed
    with open(args.choice, "w") as f:
      f.write("" if ok.get("gluon", True) else "JQAT_DECODE_KERNEL=triton")


if __name__ == "__main__":
  main()
