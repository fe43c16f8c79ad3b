"""The warp-specialized Gluon dK/dV kernel (jqat/kernels_triton/attention_bwd_ws.py) against jqat's Triton dK/dV
launch, on one Hopper GPU (torch).

    PYTHONPATH=.:benchmarks python3 benchmarks/attention_ws_bwd.py --out ws_bwd.json [--check-only] [--p-scale row]
    .venv/bin/python benchmarks/attention_ws_bwd.py --compile-only        (no GPU: builds every variant for sm_90)

Inputs as in benchmarks/attention_ws.py: BF16 [B, T, H, D], fake-quantized once by jqat's quantize kernel; the
Triton training forward on them (``quantize_qkv=False``) gives O' and lse; dO is drawn. jqat's backward plan on the
same tensors gives delta (its first launch) and the Triton kernels' dK and dV; the new kernel is launched on the
same fq(Q), fq(K), fq(V), dO, lse and delta.

Check: per variant, the share of dK's and dV's elements that differ from the Triton kernel's (the same expressions
in the same order: 0 expected), their relative Frobenius distances from it, and the distance of both kernels from the
float64 oracle of the backward (tests/oracle.py, ``attention_grad_oracle``; ``row_oracle`` with ``--p-scale row``).

Time: CUDA events around 20 back-to-back launches, median of 5: each variant, and the plan's dK/dV launch alone.
Variants: query rows a tile (m32, m64), stages of the Q/dO ring (s2..s4), the dV product a tile late (defer), and
where each tile's lse and delta come from: ``_ring`` in the ring with its Q, ``_ahead`` loaded a tile ahead by the
consumers (``ROWS_IN_RING``; the others take the plan's choice, ``attention_bwd_ws.rows_in_ring``).

``--p-scale row``: the same with p_scale="row" (the forward's row max; the kernels read the row factors that the
backward plan's own launch forms). ``--causal``: the same with a (top-left) causal mask: the Triton kernel's causal
walk against the new kernel's (``IS_CAUSAL``) alone: without a NaN the plan's REDO launch after it finds no flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from unittest import mock

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from attention_ws import PARTIAL, bhsd, finish_or_die, inputs, rel, triton_static  # noqa: E402

from jqat.ffi import plan as plans  # noqa: E402
from jqat.kernels_triton import attention_bwd_ws as ws  # noqa: E402

# (name, query rows per tile, stages, the dV product one tile late, ROWS_IN_RING: None the plan's choice
# (attention_bwd_ws.rows_in_ring), True or False forced)
VARIANTS = [("ws_m32_s2", 32, 2, False, None), ("ws_m32_s3", 32, 3, False, None),
            ("ws_m32_s3_defer", 32, 3, True, None), ("ws_m32_s4_defer", 32, 4, True, None),
            ("ws_m64_s2", 64, 2, False, None), ("ws_m64_s2_ring", 64, 2, False, True),
            ("ws_m64_s2_ahead", 64, 2, False, False)]
# (B, H, K, T, D)
CHECKS = [(1, 2, 2, 256, 128), (2, 4, 2, 512, 128), (1, 2, 2, 256, 64), (1, 4, 1, 384, 128),
          (1, 4, 2, 400, 128), (1, 2, 1, 208, 64),  # these two: T a multiple of 16 only
          (1, 4, 2, 256, 96), (1, 2, 1, 208, 96)]  # D = 96: tiles of 128 channels
TIMES = [(1, 16, 16, 4096, 128), (1, 16, 16, 16384, 128), (4, 32, 8, 4096, 128), (1, 16, 16, 8192, 64),
         (1, 40, 40, 9360, 128), (1, 16, 16, 8208, 64),  # these two: lengths the tiles do not divide
         (1, 16, 16, 8192, 96)]  # attention.py's D = 96 row
TYPES = ("*bf16",) * 4 + ("*fp32",) * 3 + ("fp32",) + ("i32",) * 17 + ("*bf16", "*bf16", "*i32")
CAUSAL = False  # --causal: every run with a top-left causal mask


def launch_params(d, block_m, stages, capability, defer, p_row_range, ring, tq=None, tk=None) -> dict:
  """``attention_bwd_ws.launch_params`` of a variant (with CAUSAL), ROWS_IN_RING forced where ``ring`` is not None."""
  params = ws.launch_params(d, block_m, stages, capability, defer, p_row_range, tq, tk, is_causal=CAUSAL)
  if ring is not None:
    params["ROWS_IN_RING"] = ring
  return params


def compile_only(arch: int = 90, p_row_range: float = 0.0) -> None:
  """Builds every variant at D = 128, 96 and 64 for ``sm_<arch>`` and prints registers, spills, shared memory and the
  consumers' loop (the loop issuing one query tile's D_PAD / 8 + BLOCK_M / 8 wgmma)."""
  from attention_ws import build_offline
  from sass_stats import ptxas_warnings

  for d in (128, 96, 64):
    for name, block_m, stages, defer, ring in VARIANTS:
      t0 = time.time()
      params = launch_params(d, block_m, stages, (arch // 10, arch % 10), defer, p_row_range, ring)
      kernel, st, sass, setmaxnreg = build_offline(ws.attention_bwd_dkdv_ws_kernel, TYPES, params, arch)
      wgmma = params["D_PAD"] // 8 + block_m // 8
      loops = [lp["instructions"] for lp in st["loops"] if lp["mix"].get("HGMMA") == wgmma]
      print(f"{name:16s} D={d:3d} regs {st['registers']} (setmaxnreg {setmaxnreg}) stack {st['stack_bytes']} B, "
            f"LDL/STL {sass.count('LDL') + sass.count('STL')}, smem {st['shared_bytes']} B, scratch "
            f"{kernel.metadata.global_scratch_size} B, loop {min(loops, default=None)} instr, ptxas notes "
            f"{ptxas_warnings(kernel, arch) or 'none'} ({time.time() - t0:.1f} s)", flush=True)


def dkdv_ws(q, k, v, do, lse, delta, scale, *, block_m=32, stages=2, defer_dv=False, row_factors=None, ring=None):
  """dK, dV of the new kernel on BTNH torch tensors (q, do [B, T, N, D]; k, v [B, Tk, K, D], bf16, heads side by
  side) and lse, delta [B, N, T] fp32; row_factors [B, N, 2, T] fp32 for p_scale="row"; ring: ROWS_IN_RING (None:
  the plan's choice)."""
  import torch

  from jqat.ffi import torch_launch

  b, t, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  if d not in ws.HEAD_DIMS or tk % 16 or n % kh:
    raise ValueError(f"dkdv_ws takes D in {ws.HEAD_DIMS}, Tk % 16 == 0; got q {tuple(q.shape)}, k {tuple(k.shape)}")
  if any(x.stride(-1) != 1 or x.stride(-2) != d for x in (q, k, v, do)):
    raise ValueError("q, k, v, do must have a contiguous last axis and heads side by side")
  dk, dv = torch.empty_like(k), torch.empty_like(v)
  row = row_factors is not None
  params = launch_params(d, block_m, stages, torch.cuda.get_device_capability(q.device), defer_dv,
                         plans.P_ROW_RANGE if row else 0.0, ring, t, tk)
  args = (q, k, v, do, lse, delta, row_factors if row else lse, scale, t, tk, n, n // kh, 0, *q.stride()[:3],
          *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], dk, dv,
          torch.empty((b * kh, -(-tk // 64)), dtype=torch.int32, device=q.device))  # the causal walk's NaN flags
  torch_launch.launch(ws.attention_bwd_dkdv_ws_kernel, (-(-tk // ws.BLOCK_N.value), b * kh), args, params)
  return dk, dv


def triton_backward(q, k, v, do, o_hp, lse, row_max=None):
  """jqat's backward plan on BTNH q, k, v, do, O' and lse [B, N, T] (and the forward's row max with p_scale="row"):
  ``(dk, dv, delta, row_factors, run_dkdv)`` with dK, dV as BTNH, delta [B, N, T], the row factors [B, N, 2, T] (None
  with "block") and a function that runs the plan's dK/dV launch alone again."""
  from jqat.ffi import torch_launch
  from jqat.torch import _attention as A

  opts = A._options(triton_static(q.shape[-1], CAUSAL, p_scale="block" if row_max is None else "row"))
  with mock.patch.dict(os.environ, {plans.BWD_KERNEL_ENV: "triton"}):  # the baseline: the Triton dK/dV kernel
    plan, views = A.backward_plan(bhsd(do), bhsd(q), bhsd(k), bhsd(v), bhsd(o_hp), lse, opts, row_max=row_max)
  launch = plan.launches[-1]
  if launch.name != "jqat_attention_bwd_dkdv":
    raise RuntimeError(f"the baseline plan's dK/dV launch is {launch.name}, not the Triton kernel's")
  views.update(torch_launch.allocate(plan, plan.outputs + plan.scratch, q.device))
  torch_launch.execute(plan, views)
  dkdv = dataclasses.replace(plan, launches=(launch,))
  return (views["dk"], views["dv"], views["delta"], views.get("row_factors"),
          functools.partial(torch_launch.execute, dkdv, views))


def case(b, h, kh, t, d, seed, p_scale="block"):
  """fq(Q), fq(K), fq(V), dO (BTNH), O' (BTNH), lse [B, N, T] and the row max [B, N, T] (None with "block") of one
  shape."""
  import torch

  from jqat.torch._attention import attention_fwd_op

  _, (q, k, v) = inputs(b, h, kh, t, d, seed)
  _, o_hp, lse, m = attention_fwd_op(bhsd(q), bhsd(k), bhsd(v), None, None, None, None,
                                     *triton_static(d, CAUSAL, p_scale=p_scale))
  g = torch.Generator(device="cuda").manual_seed(seed + 1000)
  do = torch.randn(q.shape, generator=g, device="cuda").to(torch.bfloat16)
  return q, k, v, do, bhsd(o_hp), lse, m if p_scale == "row" else None


def check(p_scale: str) -> list[dict]:
  import numpy as np
  import torch
  from attention_ws import ws as fwd_ws
  from oracle import attention_grad_oracle, row_oracle

  rows = PARTIAL.setdefault("result", {}).setdefault("check", [])
  for i, (b, h, kh, t, d) in enumerate(CHECKS):
    q, k, v, do, o_hp, lse, m = case(b, h, kh, t, d, 20 + i, p_scale)
    dk_t, dv_t, delta, rf, _ = triton_backward(q, k, v, do, o_hp, lse, m)
    torch.cuda.synchronize()
    host = lambda x: x.float().cpu().numpy()
    if p_scale == "row":  # the oracle's own forward (the same KV tiles) gives the O' of its delta
      *_, want_dk, want_dv = row_oracle(host(q), host(k), host(v), host(do), scale=d**-0.5,
                                        block_n=fwd_ws.BLOCK_N, vis=np.tril(np.ones((b, t, t), bool)) if CAUSAL
                                        else np.ones((b, t, t), bool))
    else:
      _, want_dk, want_dv = attention_grad_oracle(host(do), host(q), host(k), host(v), host(o_hp),
                                                  lse.cpu().numpy(), scale=d**-0.5, is_causal=CAUSAL,
                                                  quantize_qkv=False)
    dk_t, dv_t = host(dk_t), host(dv_t)
    base = {"B": b, "H": h, "K": kh, "T": t, "D": d, "triton_dk_vs_oracle": rel(dk_t, want_dk),
            "triton_dv_vs_oracle": rel(dv_t, want_dv)}
    for name, block_m, stages, defer, ring in VARIANTS:
      try:
        dk, dv = dkdv_ws(q, k, v, do, lse, delta, d**-0.5, block_m=block_m, stages=stages, defer_dv=defer,
                         row_factors=rf, ring=ring)
        finish_or_die(f"{name} at {(b, h, kh, t, d)}")
        dk, dv = host(dk), host(dv)
      except Exception as e:  # recorded; the other variants still run
        rows.append(dict(base, variant=name, ok=False, error=f"{type(e).__name__}: {e}"[:2000]))
        print(f"check {(b, h, kh, t, d)} {name} FAILED: {rows[-1]['error'][:300]}", flush=True)
        continue
      row = dict(base, variant=name, dk_differing=float(np.mean(dk != dk_t)), dv_differing=float(np.mean(dv != dv_t)),
                 dk_vs_triton=rel(dk, dk_t), dv_vs_triton=rel(dv, dv_t), dk_vs_oracle=rel(dk, want_dk),
                 dv_vs_oracle=rel(dv, want_dv))
      row["bitwise"] = row["dk_differing"] == 0 and row["dv_differing"] == 0
      row["ok"] = bool(np.isfinite(dk).all() and np.isfinite(dv).all()
                       and row["dk_vs_oracle"] <= 1.5 * row["triton_dk_vs_oracle"] + 1e-3
                       and row["dv_vs_oracle"] <= 1.5 * row["triton_dv_vs_oracle"] + 1e-3)
      rows.append(row)
      print(f"check {(b, h, kh, t, d)} {name}: differing dK {row['dk_differing']:.5f} dV {row['dv_differing']:.5f}; "
            f"vs oracle dK {row['dk_vs_oracle']:.3e} (triton {row['triton_dk_vs_oracle']:.3e}) dV "
            f"{row['dv_vs_oracle']:.3e} (triton {row['triton_dv_vs_oracle']:.3e}) ok {row['ok']}", flush=True)
  return rows


def time_shapes(iters: int, repeats: int, p_scale: str, shapes=TIMES) -> list[dict]:
  from _timing import cuda_event_ms

  rows = PARTIAL.setdefault("result", {}).setdefault("time", [])
  for b, h, kh, t, d in shapes:
    q, k, v, do, o_hp, lse, m = case(b, h, kh, t, d, 1, p_scale)
    dk_t, dv_t, delta, rf, run_dkdv = triton_backward(q, k, v, do, o_hp, lse, m)
    row = {"B": b, "H": h, "K": kh, "T": t, "D": d}
    rows.append(row)
    row["triton_ms"] = cuda_event_ms(run_dkdv, iters, repeats)
    print(f"time {(b, h, kh, t, d)} triton dK/dV {row['triton_ms']:.4f} ms", flush=True)
    for name, block_m, stages, defer, ring in VARIANTS:
      fn = functools.partial(dkdv_ws, q, k, v, do, lse, delta, d**-0.5, block_m=block_m, stages=stages, defer_dv=defer,
                             row_factors=rf, ring=ring)
      try:
        dk, dv = fn()
        finish_or_die(f"{name} at {(b, h, kh, t, d)}")
        row[f"{name}_bitwise"] = bool((dk == dk_t).all() and (dv == dv_t).all())
        row[f"{name}_ms"] = cuda_event_ms(fn, iters, repeats)
        print(f"time {(b, h, kh, t, d)} {name} {row[f'{name}_ms']:.4f} ms "
              f"({row['triton_ms'] / row[f'{name}_ms']:.3f}x the Triton kernel's speed) bitwise "
              f"{row[f'{name}_bitwise']}", flush=True)
      except Exception as e:
        row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:2000]
        print(f"time {(b, h, kh, t, d)} {name} FAILED: {row[f'{name}_error'][:300]}", flush=True)
  return rows


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="attention_ws_bwd.json")
  ap.add_argument("--compile-only", action="store_true", help="build every variant for sm_90 (no GPU) and stop")
  ap.add_argument("--check-only", action="store_true")
  ap.add_argument("--time-only", action="store_true")
  ap.add_argument("--times", help="comma-separated indices of the TIMES shapes to time (default: all)")
  ap.add_argument("--p-scale", choices=("block", "row"), default="block")
  ap.add_argument("--causal", action="store_true", help="a top-left causal mask")
  ap.add_argument("--variants", help="comma-separated variant names to run (default: all)")
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()
  global CAUSAL
  CAUSAL = args.causal
  if args.variants:
    VARIANTS[:] = [v for v in VARIANTS if v[0] in args.variants.split(",")]
  if CAUSAL:  # DEFER_DV's first tile is unconditional: the kernel does not take it with a causal walk
    VARIANTS[:] = [v for v in VARIANTS if not v[3]]
  if args.compile_only:
    compile_only(p_row_range=plans.P_ROW_RANGE if args.p_scale == "row" else 0.0)
    return
  import torch

  result = {"benchmark": "attention_ws_bwd", "date": time.strftime("%Y-%m-%d"),
            "device": torch.cuda.get_device_name(), "p_scale": args.p_scale, "causal": CAUSAL}
  PARTIAL.update(out=args.out, result=result)
  if not args.time_only:
    result["check"] = check(args.p_scale)
    result["check_ok"] = all(r["ok"] for r in result["check"])
    print("check ok:", result["check_ok"], flush=True)
  if not args.check_only:
    shapes = [TIMES[int(i)] for i in args.times.split(",")] if args.times else TIMES
    result["time"] = time_shapes(args.iters, args.repeats, args.p_scale, shapes)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print("wrote", args.out)


if __name__ == "__main__":
  main()
