"""One jqat decode step over a full packed NVFP4 cache through the torch binding, for NVIDIA Nsight Compute (CUDA).

  ncu --clock-control none --kernel-name regex:decode_split --launch-skip 2 --launch-count 1 \\
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats \\
      python3 benchmarks/ncu_decode.py --batch 8 --heads 32 --kv-heads 8 --seq 32768

Random codes and scales (benchmarks/decode_gluon.py's caches), BF16 queries; three calls, so that the profiled
launches are not the first, compiling ones. ``JQAT_DECODE_KERNEL`` picks the split kernel as in the library.
The counters of a report as a table: ``ncu --import R.ncu-rep --print-details all > r.txt``, then
``benchmarks/ncu_counters.py r.txt`` and ``benchmarks/report.py`` (docs/BENCHMARKS.md, "Nsight Compute counters per
kernel").
"""

from __future__ import annotations

import argparse

import torch
from decode_gluon import random_cache

import jqat.torch as jt


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--heads", type=int, default=32)
  ap.add_argument("--kv-heads", type=int, default=8)
  ap.add_argument("--seq", type=int, default=32768)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--new-tokens", type=int, default=1)
  ap.add_argument("--page-size", type=int, default=0)
  args = ap.parse_args()
  b, t, kh, d = args.batch, args.seq, args.kv_heads, args.head_dim
  kc, vc, table = random_cache(b, t, kh, d, args.page_size, 0, "cuda")
  q = torch.randn(b, args.heads, args.new_tokens, d, device="cuda", dtype=torch.bfloat16)
  lengths = torch.full((b,), t, dtype=torch.int32, device="cuda")
  for _ in range(3):
    out = jt.decode_attention(q, kc, vc, lengths, page_table=table)
  torch.cuda.synchronize()
  print("ran", tuple(q.shape), "cache", (b, t, kh, d), "paged" if table is not None else "contiguous",
        float(out.float().abs().mean()))


if __name__ == "__main__":
  main()
