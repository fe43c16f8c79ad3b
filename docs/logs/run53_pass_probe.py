"""Run 53b (session 22): what one quantize launch over Q, K and V together would save against three.
Torch, CUDA events, medians: the fake-quantize pass (``fake_quantize_rows_kernel`` with the plan's launch
parameters, sm_90 flags) over three [rows, 128] bf16 tensors in three launches, and over one [3 rows, 128] tensor in
one launch; the same for a copy (``y.copy_(x)``). rows = B * T * N of issue 13's 8 x 1024 row (131,072) and of its
16k rows (262,144).
  python3 docs/logs/run53_pass_probe.py OUT.json"""
import json, sys
import torch
sys.path.insert(0, "benchmarks")
from _timing import cuda_event_ms
from jqat.kernels_triton import nvfp4 as knv

rows_out = []
for rows in (131072, 262144):
  xs = [torch.randn(rows, 128, device="cuda").to(torch.bfloat16) for _ in range(3)]
  ys = [torch.empty_like(x) for x in xs]
  big, big_y = torch.cat(xs), torch.empty(3 * rows, 128, device="cuda", dtype=torch.bfloat16)

  def fq(x, y):
    grid, p = knv.fake_quantize_launch(x.shape[0], 128)
    knv.fake_quantize_rows_kernel[grid](x, x.shape[0], 128, 128, 128, y, BLOCK_R=p["BLOCK_R"], BLOCK_C=p["BLOCK_C"],
                                        EVEN=p["EVEN"], HW_E4M3=True, HW_E2M1=False, num_warps=p["num_warps"],
                                        num_stages=p["num_stages"])
  cases = {
      "fq_three_launches": lambda: [fq(x, y) for x, y in zip(xs, ys)],
      "fq_one_launch": lambda: fq(big, big_y),
      "copy_three": lambda: [y.copy_(x) for x, y in zip(xs, ys)],
      "copy_one": lambda: big_y.copy_(big),
  }
  for rnd in range(2):
    for name, fn in cases.items():
      row = dict(round=rnd, rows=rows, case=name, ms=round(cuda_event_ms(fn, iters=20, repeats=7), 5),
                 mb_moved=2 * 3 * rows * 128 * 2 / 1e6)
      print(json.dumps(row), flush=True)
      rows_out.append(row)
  fq(big, big_y)
  sep = torch.cat([y for y in ys])
  [fq(x, y) for x, y in zip(xs, ys)]
  print("same bits:", torch.equal(torch.cat(ys).view(torch.int16), big_y.view(torch.int16)), flush=True)
json.dump(rows_out, open(sys.argv[1], "w"), indent=1)
