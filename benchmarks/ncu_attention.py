"""One jqat attention forward and backward through the torch binding, for NVIDIA Nsight Compute (CUDA only).

  ncu --kernel-name regex:attention --launch-skip 0 --launch-count 4 \\
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
      python3 benchmarks/ncu_attention.py --seq 16384 --heads 16 --window 1024

Runs the same launch plans the JAX binding executes, once, after a warm-up call (so the
profiled launches are not the first, compiling ones). ``--window W`` adds a causal
``W``-token sliding window (``local_window_size=(W - 1, 0)``); ``--causal`` plain causal.
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
  args = ap.parse_args()
  shape = (args.batch, args.heads, args.seq, args.head_dim)
  q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
  kw = dict(is_causal=args.causal or args.window > 0)
  if args.window:
    kw["local_window_size"] = (args.window - 1, 0)
  for _ in range(2):  # the first call compiles; ncu's --launch-skip can skip its launches
    out = jt.attention(q, k, v, **kw)
    out.float().sum().backward()
  torch.cuda.synchronize()
  print("ran", shape, kw)


if __name__ == "__main__":
  main()
