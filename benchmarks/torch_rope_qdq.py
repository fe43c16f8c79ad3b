"""The PyTorch in-place RoPE + QDQ against a device-to-device copy of x (speed issue 13, item 5).

  python benchmarks/torch_rope_qdq.py --out torch_rope_qdq.json [--rows 1048576] [--cache-rows 65536]
      [--sweep 4096:4:2,16384:8:2]

For each case (mode, row width, heads per position id; 1M rows) it runs
``jqat.torch.RopeQDQInplace.execute`` on a CUDA tensor, positions drawn at random from a
cache of ``--cache-rows`` rows (65,536 x 256 B = 16 MB, L2-resident on an H200), and
reports the time (CUDA events, median), the time of ``dst.copy_(x)`` in the same process
(the two alternate ``--rounds`` times; medians of each), their ratio (the target: the op at
90% or more of the copy's speed, i.e. at most 1.11x its time), the HBM bandwidth over the
bytes that must cross HBM (x read and written, the position ids, and the cache rows only
when the cache does not fit in half of L2), and the change of ``torch.cuda.memory_allocated``
across the calls (0: truly in place). It checks that ``out is x`` and that x's ``data_ptr``
is unchanged. ``--sweep`` also times other launch configurations (channels per program :
warps : stages) of the same kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from _timing import cuda_event_ms  # noqa: E402
from rope_qdq import MODES  # noqa: E402  (benchmarks/rope_qdq.py)

import jqat  # noqa: E402
import jqat.torch as jt  # noqa: E402
from jqat.kernels_triton import rope_qdq as krope  # noqa: E402

# The speed issue's cases (13, item 5): (mode, row width, heads per position id); 1M rows each.
CASES = (("fp4/32/ue8m0", 128, 1), ("fp4/32/ue8m0", 128, 4), ("fp8/32/ue8m0", 512, 1), ("fp4/16/e4m3", 512, 1))
TARGET_COPY_FRACTION = 0.90


def bench(mode, width, heads, rows, cache_rows, l2_bytes, rounds):
  kw = MODES[mode][0]
  g = torch.Generator(device="cuda").manual_seed(rows)
  three_d = MODES[mode][2] > 1  # this mode takes x as [N, H, width] (H = 1 included)
  shape = (rows // heads, heads, width) if three_d else (rows, width)
  x = torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
  n_pos = rows // heads
  positions = torch.randint(0, cache_rows, (n_pos,), device="cuda", generator=g, dtype=torch.int32)
  ang = torch.rand(cache_rows, 32, device="cuda", generator=g) * 100
  cache = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).contiguous()
  op = jt.RopeQDQInplace(x, cache, positions, **kw)
  op.check_support()
  op.compile()
  ptr = x.data_ptr()
  dst = torch.empty_like(x)
  torch.cuda.synchronize()
  alloc0 = torch.cuda.memory_allocated()
  torch.cuda.reset_peak_memory_stats()
  # The op and the copy alternate, `rounds` times each, and each keeps its median: a clock or thermal drift
  # during the case then moves both alike instead of whichever was timed second.
  ours_t, copy_t = [], []
  for _ in range(rounds):
    ours_t.append(cuda_event_ms(lambda: op.execute(x, cache, positions)))
    copy_t.append(cuda_event_ms(lambda: dst.copy_(x)))
  ours, copy = statistics.median(ours_t), statistics.median(copy_t)
  alloc_delta = torch.cuda.memory_allocated() - alloc0
  peak_delta = torch.cuda.max_memory_allocated() - alloc0
  assert op.execute(x, cache, positions) is x and x.data_ptr() == ptr
  x_bytes = 2 * x.numel() * x.element_size()  # read + write of x: what the copy moves
  cache_bytes = cache.numel() * 4
  # HBM traffic: x both ways and the position ids; the cache only when it cannot stay in L2 (it is
  # read once per position id, at random rows).
  cache_resident = cache_bytes <= l2_bytes // 2
  hbm = x_bytes + positions.numel() * 4 + (0 if cache_resident else n_pos * 64 * 4)
  return dict(mode=mode, width=width, heads=heads, rows=rows, cache_rows=cache_rows, cache_bytes=cache_bytes,
              cache_l2_resident=cache_resident, ours_ms=ours, copy_ms=copy, time_over_copy=ours / copy,
              copy_fraction=copy / ours, hbm_bytes=hbm, ours_hbm_gbs=hbm / ours / 1e6,
              copy_gbs=x_bytes / copy / 1e6, ours_ms_rounds=ours_t, copy_ms_rounds=copy_t,
              allocated_delta=alloc_delta, peak_allocated_delta=peak_delta,
              config={k: v for k, v in krope.launch_config(width, True).items() if k != "HW"})


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="torch_rope_qdq.json")
  ap.add_argument("--rows", type=int, default=1 << 20)
  ap.add_argument("--cache-rows", type=int, default=65536, help="positions in the cos/sin cache (64 fp32 each)")
  ap.add_argument("--rounds", type=int, default=5, help="alternations of the op and the copy per case (medians)")
  ap.add_argument("--sweep", default="", help="launch configs to try instead of the default, e.g. "
                  "'4096:4:2,8192:8:2' (channels per program : warps : stages)")
  args = ap.parse_args()
  l2 = torch.cuda.get_device_properties(0).L2_cache_size
  configs = [None] + [tuple(int(v) for v in c.split(":")) for c in args.sweep.split(",") if c]
  default_config = krope.launch_config
  rows = []
  print(f"{'mode':14} {'width':>5} {'H':>2} {'config':>10} {'ours ms':>8} {'copy ms':>8} {'ours/copy':>9} "
        f"{'% copy':>7} {'HBM GB/s':>8} {'alloc +B':>8}")
  for mode, width, heads in CASES:
    for cfg in configs:
      if cfg is not None:
        def patched(w, hw, cfg=cfg):
          c = default_config(w, hw)
          c.update(BLOCK_R=max(1, cfg[0] // w), num_warps=cfg[1], num_stages=cfg[2])
          return c
        krope.launch_config = patched
      try:
        r = bench(mode, width, heads, args.rows, args.cache_rows, l2, args.rounds)
      finally:
        krope.launch_config = default_config
      r["swept"] = cfg is not None
      rows.append(r)
      c = r["config"]  # bench reads it while any patch is in place
      tag = f"{c['BLOCK_R']}x{c['num_warps']}w{c['num_stages']}s"
      print(f"{mode:14} {width:>5} {heads:>2} {tag:>10} {r['ours_ms']:>8.4f} {r['copy_ms']:>8.4f} "
            f"{r['time_over_copy']:>8.3f}x {100 * r['copy_fraction']:>6.1f}% {r['ours_hbm_gbs']:>8.0f} "
            f"{r['allocated_delta']:>8}", flush=True)
      with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(0), l2_bytes=l2, target_copy_fraction=TARGET_COPY_FRACTION,
                       results=rows), f, indent=1)
  for r in rows:
    if not r["swept"]:
      ok = r["copy_fraction"] >= TARGET_COPY_FRACTION
      print(f"{r['mode']} width {r['width']} H={r['heads']}: {100 * r['copy_fraction']:.1f}% of a copy's speed "
            f"[{'PASS' if ok else 'FAIL'}]")


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
