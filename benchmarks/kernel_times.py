"""Device time of each kernel of one jqat attention fwd+bwd, per mask case (CUDA only).

  python benchmarks/kernel_times.py --out kernel_times.json [--seq 16384] [--heads 16] \\
      [--cases full,causal,window:256,window:1024,window:4096,packed:1024,packed_causal:1024] \\
      [--p-scale row] [--qkv-scale tensor] [--batch 8 --seq 1024 --cases causal --fwd-kernels ws,triton]

Runs the torch binding (the launch plans the JAX binding runs, on torch's stream; its backward
fake-quantizes Q in a launch of its own, where the JAX one fuses it into the delta launch) under
``torch.profiler`` and reports, per case, the mean device time of every kernel per fwd+bwd, at the
GPU's normal clocks (Nsight Compute locks them lower). Cases: ``full`` (non-causal), ``causal``,
``window:W`` (causal, ``local_window_size=(W - 1, 0)``), ``packed:L`` / ``packed_causal:L`` (documents
of L tokens as segment ids); ``--p-scale`` / ``--qkv-scale`` pick the numerics mode (docs/NUMERICS.md) of every
case. Several window widths separate each kernel's cost per tile walked from
its fixed cost per call (docs/PERFORMANCE.md, section 6). ``--fwd-kernels ws,triton`` runs each case once with each
value of ``JQAT_ATTN_FWD_KERNEL`` (one column each); the groups (``report.KERNEL_GROUPS``) keep the warp-specialized
kernels apart from the Triton ones, whose launch after them is the REDO launch.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from _timing import kernel_device_ms
from report import group_times

import jqat.torch as jt
from jqat.ffi import plan


def _case_kwargs(case, seq, device):
  name, _, arg = case.partition(":")
  if name == "full":
    return {}
  if name == "causal":
    return {"is_causal": True}
  if name == "window":
    return {"is_causal": True, "local_window_size": (int(arg) - 1, 0)}
  if name in ("packed", "packed_causal"):
    seg = (torch.arange(seq, device=device, dtype=torch.int32) // int(arg))[None]
    return {"is_causal": name == "packed_causal", "q_segment_ids": seg, "kv_segment_ids": seg}
  raise ValueError(f"unknown case {case!r}")


def kernel_times(case, batch, heads, seq, head_dim, reps, p_scale="block", qkv_scale="block"):
  """{kernel name: mean device ms per fwd+bwd} for ``case`` in the numerics mode ``p_scale``, ``qkv_scale``."""
  shape = (batch, heads, seq, head_dim)
  gen = torch.Generator(device="cuda").manual_seed(0)
  q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
             for _ in range(3))
  do = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
  kw = {**_case_kwargs(case, seq, "cuda"), "p_scale": p_scale, "qkv_scale": qkv_scale}

  def step():
    jt.attention(q, k, v, **kw).backward(do)

  for _ in range(2):  # compile and warm up
    step()
  torch.cuda.synchronize()
  return kernel_device_ms(lambda i: step(), reps)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="kernel_times.json")
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--seq", type=int, default=16384)
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--reps", type=int, default=10)
  ap.add_argument("--p-scale", default="block", choices=("block", "row"))
  ap.add_argument("--qkv-scale", default="block", choices=("block", "tensor"))
  ap.add_argument("--fwd-kernels", default="",
                  help="comma-separated values of JQAT_ATTN_FWD_KERNEL (ws, triton): each case once with each")
  ap.add_argument("--cases", default="full,causal,window:256,window:1024,window:4096,packed:1024,packed_causal:1024")
  args = ap.parse_args()
  rows = {}
  for case in args.cases.split(","):
    for choice in args.fwd_kernels.split(",") if args.fwd_kernels else [None]:
      label = case
      if choice is not None:  # read at each call's plan (the torch binding plans every call)
        os.environ[plan.FWD_KERNEL_ENV] = choice
        label = f"{case} ({plan.FWD_KERNEL_ENV}={choice})"
      times = kernel_times(case, args.batch, args.heads, args.seq, args.head_dim, args.reps, args.p_scale,
                           args.qkv_scale)
      grouped = group_times(times)
      rows[label] = {"kernels": times, "grouped": grouped, "total": sum(times.values())}
      print(f"{label:<22} total {rows[label]['total']:8.3f} ms  "
            + "  ".join(f"{k} {t:.3f}" for k, t in sorted(grouped.items(), key=lambda kv: -kv[1])), flush=True)
  shape = dict(batch=args.batch, heads=args.heads, seq=args.seq, head_dim=args.head_dim, reps=args.reps,
               p_scale=args.p_scale, qkv_scale=args.qkv_scale)
  with open(args.out, "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "shape": shape, "cases": rows}, f, indent=1)


if __name__ == "__main__":
  main()
