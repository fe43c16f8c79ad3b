"""The PyTorch in-place RoPE + QDQ: bytes moved, time and allocations, against a torch D2D copy.

  python benchmarks/torch_rope_qdq.py --out torch_rope_qdq.json

For each mode and row count it runs ``jqat.torch.RopeQDQInplace.execute`` on a
CUDA tensor and reports: the time (CUDA events, median), the effective
bandwidth over the bytes an in-place op must move (x read + x written + the
cache rows and positions read), the same bytes through ``dst.copy_(src)``
(device-to-device copy, timed the same way), and the change of
``torch.cuda.memory_allocated`` / ``max_memory_allocated`` across the calls
(0 for a truly in-place op: no staging buffer, no copy written back). It also
checks that ``out is x`` and that x's ``data_ptr`` is unchanged.
"""

from __future__ import annotations

import argparse
import json

import torch
from _timing import cuda_event_ms  # noqa: E402
from rope_qdq import CACHE_POSITIONS, MODES, moved_bytes  # noqa: E402  (benchmarks/rope_qdq.py)

import jqat  # noqa: E402
import jqat.torch as jt  # noqa: E402


def bench(mode, rows):
  kw, width, heads = MODES[mode]
  g = torch.Generator(device="cuda").manual_seed(rows)
  shape = (rows // heads, heads, width) if heads > 1 else (rows, width)
  x = torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
  n_pos = rows // heads
  positions = torch.randint(0, CACHE_POSITIONS, (n_pos,), device="cuda", generator=g, dtype=torch.int32)
  ang = torch.rand(CACHE_POSITIONS, 32, device="cuda", generator=g) * 100
  cache = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).contiguous()
  op = jt.RopeQDQInplace(x, cache, positions, **kw)
  op.check_support()
  op.compile()
  ptr = x.data_ptr()
  torch.cuda.synchronize()
  alloc0 = torch.cuda.memory_allocated()
  torch.cuda.reset_peak_memory_stats()
  ours = cuda_event_ms(lambda: op.execute(x, cache, positions))
  alloc_delta = torch.cuda.memory_allocated() - alloc0
  peak_delta = torch.cuda.max_memory_allocated() - alloc0
  assert op.execute(x, cache, positions) is x and x.data_ptr() == ptr
  dst = torch.empty_like(x)
  copy = cuda_event_ms(lambda: dst.copy_(x))
  moved = moved_bytes(mode, rows)
  return dict(mode=mode, rows=rows, ours_ms=ours, ours_gbs=moved / ours / 1e6, copy_ms=copy,
              copy_gbs=2 * x.numel() * 2 / copy / 1e6, pct_of_copy=100 * (moved / ours) / (2 * x.numel() * 2 / copy),
              bytes_moved=moved, allocated_delta=alloc_delta, peak_allocated_delta=peak_delta)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="torch_rope_qdq.json")
  ap.add_argument("--rows", default="1048576,4194304")
  args = ap.parse_args()
  rows = []
  print(f"{'mode':14} {'rows':>9} {'ours ms':>8} {'GB/s':>6} {'copy GB/s':>9} {'% copy':>7} {'alloc +B':>8} "
        f"{'peak +B':>8}")
  for mode in MODES:
    for n in (int(r) for r in args.rows.split(",")):
      r = bench(mode, n)
      rows.append(r)
      print(f"{mode:14} {n:>9} {r['ours_ms']:>8.4f} {r['ours_gbs']:>6.0f} {r['copy_gbs']:>9.0f} "
            f"{r['pct_of_copy']:>6.1f}% {r['allocated_delta']:>8} {r['peak_allocated_delta']:>8}", flush=True)
      with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
