"""The warp-specialized Gluon forward (jqat/kernels_triton/attention_fwd_ws.py) against jqat's
Triton forward and cuDNN, on one Hopper GPU (torch).

    PYTHONPATH=.:benchmarks python3 benchmarks/attention_ws.py --out ws.json [--check-only | --time-only]
    .venv/bin/python benchmarks/attention_ws.py --compile-only        (no GPU: builds every variant for sm_90)

Inputs: BF16 [B, T, H, D] (BTNH), fake-quantized once by jqat's Triton quantize kernel (``fake_quantize_rows_kernel``,
the pass the library runs before its forward), so that every implementation sees the same fq(Q), fq(K), fq(V);
the O-alone forward (``quantize_qkv=False`` for the Triton plan: the values are already quantized), KV tiles of 64
keys, GQA where K < H, causal (top-left) where the case says so, p_scale "block" unless it says "row".

Check: at small shapes, per variant of the new kernel, the relative Frobenius distance of its O from the float64 NumPy
oracle of the same walk (tests/oracle.py, ``attention_oracle`` without fq of Q, K, V: fq(P) per tile of 64 keys
relative to the running max), the Triton forward's distance from the same oracle, the distance of the new kernel
from the Triton kernel and the share of O's elements that differ from it, and the largest |lse - lse_oracle|. The
kernels run exp2 with log2 e folded into the scale where the oracle runs exp, so each is compared with the oracle,
and the bound is relative to the Triton kernel's own distance. The quantized inputs are also checked bit for bit
against the oracle's fq. The variants of FULL_CHECKS (the plan's, and the lookahead build ``ws_c2_ahead``) that are
among those checked also run the training forward at D = 96 and 128 (``<variant>_residuals``: O, O' and lse, and in
row mode the row max), whose outputs must equal the Triton training forward's element for element, and the row-mode
cases (no oracle of row mode here: O alone is compared element for element with the Triton O-alone forward's). The
Triton kernels are reached through the plans with ``JQAT_ATTN_FWD_KERNEL=triton`` (set here): the new kernel is
launched directly.

Time: CUDA events around 20 back-to-back calls, median of 5 (benchmarks/_timing.py), at the shapes of TIMES
(``--time-rows`` picks some): the new kernel's variants (consumer warpgroups, ping-pong, stages, the lookahead),
the Triton O-alone forward (``torch.ops.jqat.attention_out``: one launch) and cuDNN's BF16 forward (torch SDPA under
``sdpa_kernel(CUDNN_ATTENTION)``, on the unquantized BF16 inputs); TFLOP/s count the two matmuls (4 B H T^2 D).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

# jqat.torch imports JAX; should anything initialize a JAX backend, it must not take the GPU's memory from torch.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# The baselines are jqat's Triton forward (through the plans, which would otherwise launch the warp-specialized kernel
# where it applies); the warp-specialized kernel is launched here directly.
os.environ["JQAT_ATTN_FWD_KERNEL"] = "triton"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jqat.ffi.options import P_ROW_RANGE  # noqa: E402
from jqat.kernels_triton import attention_fwd_ws as ws  # noqa: E402

# (name, consumers, ping-pong, stages, lookahead): the variants checked and timed. The first is the plan's.
VARIANTS = [
    ("ws_c2", 2, False, 3, False),
    ("ws_c2_ahead", 2, False, 3, True),
    ("ws_c2_pingpong", 2, True, 3, False),
    ("ws_c2_pingpong_s2", 2, True, 2, False),
    ("ws_c2_pingpong_s4", 2, True, 4, False),
    ("ws_c1", 1, False, 3, False),
    ("ws_c3", 3, False, 3, False),
]
FULL_CHECKS = VARIANTS[:2]  # the variants checked in row mode and as the training forward too (the plan's first)
# (B, H, K, T, D, causal): K the KV heads (GQA where K < H); causal is top-left (Tq = Tk here)
CHECKS = [(1, 2, 2, 256, 128, False), (2, 4, 4, 1024, 128, False), (1, 4, 2, 512, 128, False),
          (1, 2, 2, 512, 64, False), (1, 2, 2, 512, 128, True), (2, 4, 2, 1024, 128, True), (1, 2, 2, 384, 64, True),
          # lengths that are not multiples of the tiles: a partial row block and key tile, one tile in all
          (1, 4, 2, 400, 128, False), (1, 2, 1, 40, 128, False), (1, 2, 2, 200, 128, True),
          # D = 96 (tiles of 128 channels); p_scale "row" (the plan's variant only: O alone and the training forward)
          (1, 4, 2, 512, 96, False), (1, 2, 2, 200, 96, True), (1, 4, 2, 512, 128, False, "row"),
          (1, 2, 2, 400, 128, True, "row"), (1, 2, 1, 200, 96, True, "row")]
# (D, causal, residuals, p_scale) of the offline builds: every variant for O alone at D = 64 and 128 without a mask,
# the plan's elsewhere
BUILDS = [(128, False, False, "block"), (64, False, False, "block"), (128, True, False, "block"),
          (128, False, True, "block"), (128, True, True, "block"), (96, False, False, "block"),
          (96, True, True, "block"), (128, False, False, "row"), (128, False, True, "row"), (128, True, True, "row"),
          (96, False, True, "row")]
TIMES = [(1, 16, 16, 4096, 128, False), (1, 16, 16, 16384, 128, False), (1, 16, 16, 4096, 128, True),
         (1, 16, 16, 16384, 128, True), (2, 16, 16, 4096, 64, False), (1, 16, 16, 16384, 64, False),
         (8, 16, 16, 1024, 128, True), (1, 32, 8, 8192, 128, True)]
WATCHDOG_S = 60.0  # a first launch still running after this long is taken for a deadlock (barrier phases)
PARTIAL: dict = {}  # the results so far and where they go, written out if the watchdog fires


# ----------------------------------------------------------------------------- offline build


def build_offline(kernel_fn, types, params: dict, arch: int):
  """``(kernel, sass_stats without the SASS text, the SASS text, the setmaxnreg counts in its PTX)`` of a Gluon
  kernel built for ``sm_<arch>`` with ``params`` (its constexprs and launch options, as ``launch_params`` gives
  them)."""
  import re

  from sass_stats import sass_stats

  from jqat.ffi import triton_call

  params = dict(params)
  num_warps, maxnreg = params.pop("num_warps"), params.pop("maxnreg")
  kernel = triton_call.build(kernel_fn, types, (), tuple(params.items()), num_warps, 1, (arch // 10, arch % 10),
                             maxnreg=maxnreg)
  st = sass_stats(kernel)
  sass = st.pop("sass")
  setmaxnreg = sorted({int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"])})
  return kernel, st, sass, setmaxnreg


def compile_only(arch: int = 90) -> list[dict]:
  """Builds every variant at D = 128 and 64 for ``sm_<arch>`` (no GPU) and prints what ptxas made of it: launch
  registers (the per-thread count the SM reserves) and the partitions' ``setmaxnreg`` counts, stack (spills),
  local loads and stores, shared memory, global scratch, the longest loops' instruction counts and ptxas's
  "Potential Performance Loss" notes (serialized wgmma)."""
  from sass_stats import ptxas_warnings

  rows = []
  types = ("*bf16", ) * 3 + ("fp32",) + ("i32", ) * 16 + ("*bf16", "*fp32", "*i32")  # outputs last (then O')
  for d, causal, residuals, p_scale in BUILDS:
    every = p_scale == "block" and not residuals and (d == 64 or (d == 128 and not causal))
    for name, consumers, pingpong, stages, ahead in VARIANTS if every else FULL_CHECKS:
      row_range = P_ROW_RANGE if p_scale == "row" else 0.0
      params = ws.launch_params(d, stages, consumers, pingpong, (arch // 10, arch % 10), causal, residuals, row_range,
                                ahead)
      t0 = time.time()
      arg_types = types + ("*bf16",) * residuals + ("*fp32",) * (residuals and p_scale == "row")
      kernel, st, sass, setmaxnreg = build_offline(ws.attention_fwd_ws_kernel, arg_types, params, arch)
      # The consumers' KV loops, in instructions a tile: the loops issuing one tile's products (D / 16 wgmma for S, 4
      # for each P V), or two tiles' (the lookahead's unmasked walk), not the partitions' dispatch loop around them.
      per_tile = params["D_PAD"] // 16 + 4 * (1 + residuals)
      loops = [lp["instructions"] / (lp["mix"]["HGMMA"] // per_tile) for lp in st["loops"]
               if lp["mix"].get("HGMMA") in (per_tile, 2 * per_tile)]
      row = {"variant": name, "D": d, "causal": causal, "residuals": residuals, "p_scale": p_scale,
             "compile_s": round(time.time() - t0, 2),
             "warps": kernel.metadata.num_warps,
             "launch_registers": st["registers"], "maxnreg": params["maxnreg"], "setmaxnreg": setmaxnreg,
             "stack_bytes": st["stack_bytes"], "local_ld_st": sass.count("LDL") + sass.count("STL"),
             "shared_bytes": st["shared_bytes"], "global_scratch": kernel.metadata.global_scratch_size,
             "hgmma": st["mix"].get("HGMMA", 0), "kv_loops": loops, "ptxas_warnings": ptxas_warnings(kernel, arch)}
      rows.append(row)
      outs = " O, O', lse" if residuals else ""
      print(f"{name:18s} D={d:3d}{' causal' if causal else ''}{outs}{' row' if p_scale == 'row' else ''} warps "
            f"{row['warps']:2d} regs "
            f"{row['launch_registers']} (setmaxnreg "
            f"{row['setmaxnreg']}) stack {row['stack_bytes']} B, LDL/STL {row['local_ld_st']}, smem "
            f"{row['shared_bytes']} B, scratch {row['global_scratch']} B, KV loops {row['kv_loops']} instr, "
            f"ptxas notes {row['ptxas_warnings'] or 'none'} ({row['compile_s']} s)", flush=True)
  return rows


# ----------------------------------------------------------------------------- GPU


def attention_fwd_ws(q, k, v, scale: float | None = None, *, stages: int = 3, consumers: int = 2,
                     pingpong: bool = False, is_causal: bool = False, residuals: bool = False,
                     p_scale: str = "block", lookahead: bool = False):
  """O and lse of one variant of the warp-specialized forward on torch CUDA tensors (sm_90): q [B, T, N, D], k, v
  [B, Tk, K, D] bf16, already fake-quantized, BTNH with a contiguous last axis. Returns ``(o [B, T, N, D] bf16, lse
  [B, N, T] fp32)``, with ``residuals`` ``(o, o', lse)`` (the training forward's outputs) and in row mode also the
  row max [B, N, T] fp32. No masks but the causal one (top-left: query row r sees keys k <= r), p_scale "block" or
  "row"; any T and Tk > 0. (The library's plan launches the default variant.)"""
  import torch

  from jqat.ffi import torch_launch

  b, t, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  rows = int(ws.WG_ROWS.value) * consumers
  if d not in ws.HEAD_DIMS or t == 0 or tk == 0 or n % kh:
    raise ValueError(f"attention_fwd_ws takes D in {ws.HEAD_DIMS}, T and Tk > 0, N % K == 0; got q "
                     f"{tuple(q.shape)}, k {tuple(k.shape)}")
  if any(x.dtype != torch.bfloat16 or x.stride(-1) != 1 for x in (q, k, v)):
    raise ValueError("q, k, v must be bf16 with a contiguous last axis")
  scale = d**-0.5 if scale is None else float(scale)
  o = torch.empty_like(q)
  lse = torch.empty((b, n, t), dtype=torch.float32, device=q.device)
  # The NaN flags of a causal walk (the inputs here hold no NaN: every flag 0, every O row stored)
  leaks = torch.empty((b * n, -(-t // int(ws.WG_ROWS.value))), dtype=torch.int32, device=q.device)
  row_max = residuals and p_scale == "row"
  params = ws.launch_params(d, stages, consumers, pingpong, torch.cuda.get_device_capability(q.device), is_causal,
                            residuals, P_ROW_RANGE if p_scale == "row" else 0.0, lookahead)
  o_hp = torch.empty_like(q) if residuals else None
  m = torch.empty_like(lse) if row_max else None
  args = (q, k, v, scale, t, tk, n, n // kh, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], o,
          lse, leaks) + ((o_hp,) if residuals else ()) + ((m,) if row_max else ())
  blocks = -(-t // rows)
  grid = (b * n, blocks) if is_causal else (blocks, b * n)  # causal: longest walks first (the kernel)
  torch_launch.launch(ws.attention_fwd_ws_kernel, grid, args, params)
  return ((o, o_hp, lse) + ((m,) if row_max else ())) if residuals else (o, lse)


def quantize(x):
  """fq(x) along the last axis by jqat's Triton quantize kernel (the library's pass), same shape and dtype."""
  import torch

  from jqat.kernels_triton import nvfp4

  flat = x.reshape(-1, x.shape[-1])
  out = torch.empty_like(flat)
  grid, params = nvfp4.fake_quantize_launch(flat.shape[0], flat.shape[1])
  nvfp4.fake_quantize_rows_kernel[grid](flat, flat.shape[0], flat.shape[1], flat.stride(0), out.stride(0), out,
                                        **params, **nvfp4.quant_flags(torch.cuda.get_device_capability()))
  return out.view(x.shape)


def inputs(b, h, kh, t, d, seed):
  """Raw BF16 q, k, v (BTNH) and their fq: scores of a few units (q and k drawn with std 1.5)."""
  import torch

  g = torch.Generator(device="cuda").manual_seed(seed)
  draw = lambda heads, std: (torch.randn((b, t, heads, d), generator=g, device="cuda") * std).to(torch.bfloat16)
  raw = (draw(h, 1.5), draw(kh, 1.5), draw(kh, 1.0))
  return raw, tuple(quantize(x) for x in raw)


def triton_static(d: int, causal: bool = False, p_scale: str = "block") -> tuple:
  """The static scalars of jqat's torch ops for the O-alone forward on already-quantized inputs."""
  from jqat.ffi import options

  return options.keyword_scalars(head_dim=d, scale=d**-0.5, is_causal=causal, block_n=ws.BLOCK_N, quantize_qkv=False,
                                 quantize_p=True, high_precision_delta=True, quantize_p_backward=True,
                                 local_window_size=None, causal_alignment="top_left", p_scale=p_scale,
                                 qkv_scale="block")


def bhsd(x):
  return x.transpose(1, 2)


def triton_out(q, k, v, causal=False, p_scale="block"):
  """jqat's Triton O-alone forward (one launch) on BTNH q, k, v: O as BTNH."""
  from jqat.torch._attention import attention_out_op

  return bhsd(attention_out_op(bhsd(q), bhsd(k), bhsd(v), None, None, None, None,
                               *triton_static(q.shape[-1], causal, p_scale)))


def triton_forward(q, k, v, causal=False, p_scale="block"):
  """jqat's Triton training forward on BTNH q, k, v: (O, O' as BTNH, lse [B, H, T]), in row mode also the row max
  [B, H, T]."""
  from jqat.torch._attention import attention_fwd_op

  o, o_hp, lse, m = attention_fwd_op(bhsd(q), bhsd(k), bhsd(v), None, None, None, None,
                                     *triton_static(q.shape[-1], causal, p_scale))
  return (bhsd(o), bhsd(o_hp), lse) + ((m,) if p_scale == "row" else ())


def finish_or_die(what: str, seconds: float = WATCHDOG_S) -> None:
  """Waits for the GPU's work so far, polling an event; exits the process if it has not finished in ``seconds``
  (a deadlocked barrier never returns, and a blocking synchronize could not be interrupted), after writing the
  results so far (``PARTIAL``)."""
  import torch

  ev = torch.cuda.Event()
  ev.record()
  deadline = time.time() + seconds
  while not ev.query():
    if time.time() > deadline:
      print(f"TIMEOUT: {what} still running after {seconds:.0f} s: taken for a deadlock", flush=True)
      if PARTIAL.get("out"):
        with open(PARTIAL["out"], "w") as f:
          json.dump(dict(PARTIAL["result"], timeout=what), f, indent=1)
      os._exit(3)
    time.sleep(0.005)


def rel(a, b) -> float:
  import numpy as np

  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def check(variants=VARIANTS) -> list[dict]:
  import numpy as np
  import torch
  from oracle import attention_oracle, fq_oracle

  rows = PARTIAL.setdefault("result", {}).setdefault("check", [])
  plan_checked = any(v in variants for v in FULL_CHECKS)  # the row-mode and training-forward checks
  for i, (b, h, kh, t, d, causal, *mode) in enumerate(CHECKS):
    p_scale = mode[0] if mode else "block"
    if p_scale == "row" and not plan_checked:
      continue
    raw, (q, k, v) = inputs(b, h, kh, t, d, seed=10 + i)
    fq_ok = all(np.array_equal(fq_oracle(r.float().cpu().numpy()), x.float().cpu().numpy())
                for r, x in zip(raw, (q, k, v)))
    tri_fwd = triton_forward(q, k, v, causal, p_scale)
    tri_o_alone = triton_out(q, k, v, causal, p_scale)
    torch.cuda.synchronize()
    tri = tri_fwd[0].float().cpu().numpy()
    base = {"B": b, "H": h, "K": kh, "T": t, "D": d, "causal": causal, "p_scale": p_scale,
            "fq_inputs_bitwise": fq_ok, "triton_o_alone_equals_training_o": bool(torch.equal(tri_o_alone, tri_fwd[0]))}
    case = (b, h, kh, t, d, causal) + ((p_scale,) if mode else ())
    if p_scale == "block":  # every variant against the float64 oracle of the walk (block mode's) and the Triton O
      want_o, _, want_lse = attention_oracle(*(x.float().cpu().numpy() for x in (q, k, v)), scale=d**-0.5,
                                             is_causal=causal, block_n=ws.BLOCK_N, quantize_qkv=False,
                                             quantize_p=True)
      base.update(triton_vs_oracle=rel(tri, want_o),
                  triton_lse_max_abs=float(np.max(np.abs(tri_fwd[2].cpu().numpy() - want_lse))))
      for name, consumers, pingpong, stages, ahead in variants:
        try:
          o, lse = attention_fwd_ws(q, k, v, stages=stages, consumers=consumers, pingpong=pingpong, lookahead=ahead,
                                    is_causal=causal)
          finish_or_die(f"{name} at {case}")
          got = o.float().cpu().numpy()
        except Exception as e:  # a build or launch failure: recorded, and the other variants still run
          rows.append(dict(base, variant=name, ok=False, error=f"{type(e).__name__}: {e}"[:2000]))
          print(f"check {case} {name:18s} FAILED: {rows[-1]['error'][:300]}", flush=True)
          continue
        row = dict(base, variant=name, finite=bool(np.isfinite(got).all()), ws_vs_oracle=rel(got, want_o),
                   ws_vs_triton=rel(got, tri), differing=float(np.mean(got != tri)),
                   ws_lse_max_abs=float(np.max(np.abs(lse.cpu().numpy() - want_lse))))
        # The same function as the Triton kernel up to FP32 summation order and fq(P) codes on rounding boundaries:
        # as close to the oracle as the Triton kernel is (with slack for those flips), and close to it.
        row["ok"] = (row["finite"] and fq_ok and row["ws_vs_oracle"] <= 1.5 * row["triton_vs_oracle"] + 1e-3
                     and row["ws_vs_triton"] < 1e-2 and row["ws_lse_max_abs"] < 1e-3)
        rows.append(row)
        print(f"check {case} {name:18s} ws-oracle {row['ws_vs_oracle']:.3e} triton-oracle "
              f"{row['triton_vs_oracle']:.3e} ws-triton {row['ws_vs_triton']:.3e} differing {row['differing']:.5f} "
              f"lse {row['ws_lse_max_abs']:.1e} fq {fq_ok} ok {row['ok']}", flush=True)
    if d == 64:
      continue
    for name, consumers, pingpong, stages, ahead in [v for v in FULL_CHECKS if v in variants]:
      if p_scale == "row":  # no oracle of row mode here (tests/test_numerics_modes_triton.py): O alone bit for bit
        o, _ = attention_fwd_ws(q, k, v, stages=stages, consumers=consumers, pingpong=pingpong, lookahead=ahead,
                                is_causal=causal, p_scale=p_scale)
        finish_or_die(f"{name} at {case}")
        differing = float((o != tri_o_alone).float().mean())
        rows.append(dict(base, variant=name, differing=differing, ok=fq_ok and differing == 0.0))
        print(f"check {case} {name:18s} differing from the Triton O-alone forward: O {differing:.5f} "
              f"ok {rows[-1]['ok']}", flush=True)
      # The training forward: O, O' and lse (and the row max) against the Triton training forward's, element for
      # element
      outs = attention_fwd_ws(q, k, v, stages=stages, consumers=consumers, pingpong=pingpong, lookahead=ahead,
                              is_causal=causal, residuals=True, p_scale=p_scale)
      finish_or_die(f"{name} O, O', lse at {case}")
      differing = [float((x != y).float().mean()) for x, y in zip(outs, tri_fwd, strict=True)]
      row = dict(base, variant=name + "_residuals", **dict(zip(("differing", "differing_o_hp", "differing_lse",
                                                                 "differing_row_max"), differing)))
      row["ok"] = fq_ok and max(differing) == 0.0
      rows.append(row)
      print(f"check {case} {row['variant']:18s} differing from the Triton training forward: "
            + " ".join(f"{n} {x:.5f}" for n, x in zip(("O", "O'", "lse", "row max"), differing)) + f" ok {row['ok']}",
            flush=True)
  return rows


def _save_partial() -> None:
  if PARTIAL.get("out"):
    with open(PARTIAL["out"], "w") as f:
      json.dump(PARTIAL["result"], f, indent=1)


def time_shapes(iters: int, repeats: int, variants=VARIANTS, shapes=TIMES) -> list[dict]:
  import torch
  from _timing import cuda_event_ms
  from torch.nn.attention import SDPBackend, sdpa_kernel

  rows = PARTIAL.setdefault("result", {}).setdefault("time", [])
  for b, h, kh, t, d, causal in shapes:
    raw, (q, k, v) = inputs(b, h, kh, t, d, seed=1)
    flop = 4.0 * b * h * t * t * d / (2 if causal else 1)
    shape = (b, h, kh, t, d, causal)
    row = {"B": b, "H": h, "K": kh, "T": t, "D": d, "causal": causal}
    rows.append(row)
    ref = triton_out(q, k, v, causal)
    finish_or_die("triton forward")
    # The baselines first, and every time printed and saved as it is measured: a variant that faults leaves the CUDA
    # context unusable for everything after it.
    row["triton_ms"] = cuda_event_ms(functools.partial(triton_out, q, k, v, causal), iters, repeats)
    print(f"time {shape} triton {row['triton_ms']:.4f} ms", flush=True)
    row["cudnn_bf16_ms"] = None
    for layout, prep in (("btnh_view", bhsd), ("bhsd_contiguous", lambda x: bhsd(x).contiguous())):
      qb, kb, vb = (prep(x) for x in raw)
      try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
          sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention, qb, kb, vb,
                                   enable_gqa=kh != h, is_causal=causal)
          row["cudnn_bf16_ms"] = cuda_event_ms(sdpa, iters, repeats)
          row["cudnn_layout"] = layout
          print(f"time {shape} cudnn_bf16 {row['cudnn_bf16_ms']:.4f} ms ({layout})", flush=True)
          break
      except RuntimeError as e:  # cuDNN refused this layout (or this torch build has no cuDNN attention)
        row[f"cudnn_error_{layout}"] = str(e).splitlines()[0]
    _save_partial()
    for name, consumers, pingpong, stages, ahead in variants:
      fn = functools.partial(attention_fwd_ws, q, k, v, stages=stages, consumers=consumers, pingpong=pingpong,
                             lookahead=ahead, is_causal=causal)
      try:
        o, _ = fn()
        finish_or_die(f"{name} at {shape}")
        row[f"{name}_vs_triton"] = rel(o.float().cpu().numpy(), ref.float().cpu().numpy())
        row[f"{name}_ms"] = cuda_event_ms(fn, iters, repeats)
        print(f"time {shape} {name} {row[f'{name}_ms']:.4f} ms "
              f"({row['triton_ms'] / row[f'{name}_ms']:.3f}x the Triton forward's speed)", flush=True)
      except Exception as e:  # recorded; the other variants still run (if the context survived)
        row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:2000]
        print(f"time {shape} {name} FAILED: {row[f'{name}_error'][:300]}", flush=True)
      for key in [k_ for k_ in row if k_.endswith("_ms")]:
        if row[key]:
          row[key.replace("_ms", "_tflops")] = flop / row[key] / 1e9
      _save_partial()
  return rows


def print_times(rows: list[dict]) -> None:
  names = [v[0] for v in VARIANTS] + ["triton", "cudnn_bf16"]
  print("\nshape (B, H, K, T, D, causal) | " + " | ".join(f"{n:>18s}" for n in names))
  for r in rows:
    cells = []
    for n in names:
      ms = r.get(f"{n}_ms")
      cells.append(f"{ms:7.3f} ms {r[f'{n}_tflops']:5.0f} TF" if ms else f"{'-':>18s}")
    print(f"{str((r['B'], r['H'], r['K'], r['T'], r['D'], r['causal'])):29s} | " + " | ".join(cells))
  print("(TF: TFLOP/s of the two matmuls, 4 B H T^2 D, halved when causal)")


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="attention_ws.json")
  ap.add_argument("--compile-only", action="store_true", help="build every variant for sm_90 (no GPU) and stop")
  ap.add_argument("--check-only", action="store_true")
  ap.add_argument("--time-only", action="store_true")
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--time-rows", default=None, help="comma-separated indices of TIMES to time (default: all)")
  ap.add_argument("--variants", default=None,
                  help="comma-separated names of VARIANTS to check and time (default: all checked, all but ws_c1 "
                       "timed: it faults when timed at 4096 tokens and leaves the CUDA context unusable)")
  args = ap.parse_args()
  names = None if args.variants is None else args.variants.split(",")
  checked = [v for v in VARIANTS if names is None or v[0] in names]
  timed = [v for v in VARIANTS if (v[0] != "ws_c1" if names is None else v[0] in names)]
  if args.compile_only:
    compile_only()
    return
  import torch

  result = {"benchmark": "attention_ws", "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
            "variants": [dict(zip(("name", "consumers", "pingpong", "stages", "lookahead"), v)) for v in VARIANTS]}
  PARTIAL.update(out=args.out, result=result)
  if not args.time_only:
    result["check"] = check(checked)
    result["check_ok"] = all(r["ok"] for r in result["check"])
    print("check ok:", result["check_ok"], flush=True)
  if not args.check_only:
    shapes = TIMES if args.time_rows is None else [TIMES[int(i)] for i in args.time_rows.split(",")]
    result["time"] = time_shapes(args.iters, args.repeats, timed, shapes)
    print_times(result["time"])
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print("wrote", args.out)


if __name__ == "__main__":
  main()
