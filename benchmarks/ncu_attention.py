"""One jqat attention forward and backward through the torch binding, for NVIDIA Nsight Compute (CUDA only).

  ncu --kernel-name regex:attention --launch-skip 0 --launch-count 4 \\
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
      python3 benchmarks/ncu_attention.py --seq 16384 --heads 16 --window 1024

Runs the same launch plans the JAX binding executes, once, after a warm-up call (so the
profiled launches are not the first, compiling ones). ``--window W`` adds a causal
``W``-token sliding window (``local_window_size=(W - 1, 0)``); ``--causal`` plain causal.
``--forward-only``: O alone (inputs without grad: the inference forward, no residuals), which
``JQAT_ATTN_FWD_KERNEL=ws`` runs on the warp-specialized kernel (``--kernel-name regex:attention_fwd``).
``--p-scale row``: the probabilities' row mode (the backward's dK/dV reads the row factors). ``--btnh``: tensors
stored [B, S, H, D] (heads side by side, JAX's layout), the storage the warp-specialized dK/dV kernel takes
(``--kernel-name regex:dkdv_ws``); without it BHSD storage runs the Triton dK/dV kernel.
The counters of a report as a table: ``ncu --import R.ncu-rep --print-details all > r.txt``, then
``benchmarks/ncu_counters.py r.txt`` and ``benchmarks/report.py`` (docs/BENCHMARKS.md, "Nsight Compute counters per
kernel").
"""

from __future__ import annotations

import argparse

import torch

import jqat.torch as jt


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--seq", type=int, default=16384)
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--window", type=int, default=0)
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--forward-only", action="store_true", help="O alone: no grad, no backward")
  ap.add_argument("--p-scale", choices=("block", "row"), default="block")
  ap.add_argument("--btnh", action="store_true", help="[B, S, H, D] storage (heads side by side)")
  args = ap.parse_args()
  shape = (args.batch, args.heads, args.seq, args.head_dim)
  grad = not args.forward_only
  if args.btnh:  # BHSD views of [B, S, H, D] tensors
    stored = (args.batch, args.seq, args.heads, args.head_dim)
    q, k, v = (torch.randn(stored, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_(grad)
               for _ in range(3))
  else:
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3))
  kw = dict(is_causal=args.causal or args.window > 0, p_scale=args.p_scale)
  if args.window:
    kw["local_window_size"] = (args.window - 1, 0)
  d_out = torch.randn_like(q)  # stored as q is (autograd's gradient of a sum would be stored as O, BHSD)
  for _ in range(2):  # the first call compiles; ncu's --launch-skip can skip its launches
    out = jt.attention(q, k, v, **kw)
    if grad:
      out.backward(d_out)
  torch.cuda.synchronize()
  print("ran", shape, kw)


if __name__ == "__main__":
  main()
