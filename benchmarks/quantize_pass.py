"""The attention plans' quantize pass (fq(Q), fq(K), fq(V) in one launch) against a device copy of the same bytes.

  python benchmarks/quantize_pass.py --out quantize_pass.json

Times, in CUDA graphs of 20 calls (kernels only), the pass's launch as the plans make it (``plan._fake_quantize``'s
kernel and grid: ``fake_quantize_many_launch``) over three BF16 tensors of B * T * N rows of D = 128, and
``torch.Tensor.copy_`` of the same three tensors (the rate of a device copy). Inputs cycle between copies so that no
call finds them in the L2. TB/s counts the bytes read and written (2 bytes a value each way).
"""

from __future__ import annotations

import argparse
import json

from _timing import graph_replay_ms

SHAPES = [(8, 1024, 16), (1, 4096, 16), (1, 16384, 16), (2, 4096, 16)]


def time_shape(b: int, t: int, n: int) -> dict:
  """The pass and the copy over three [b * t * n, 128] BF16 tensors: ms and TB/s of each."""
  import torch

  from jqat.kernels_triton import nvfp4 as knv

  flags = knv.quant_flags(torch.cuda.get_device_capability())
  rows = b * t * n
  nbytes = 3 * rows * 128 * 2 * 2  # read and written, per call
  copies = max(2, -(-768_000_000 // nbytes))  # at least 768 MB of inputs and outputs in all
  gen = torch.Generator(device="cuda").manual_seed(0)
  xs = [[torch.randn(rows, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)]
        for _ in range(copies)]
  outs = [[torch.empty_like(x) for x in c] for c in xs]
  grid, launch = knv.fake_quantize_many_launch((rows,) * 3, 128)

  def quantize(i):
    knv.fake_quantize_rows3_kernel[grid](*xs[i % copies], rows, rows, rows, 128, *outs[i % copies], **launch, **flags)

  def copy(i):
    for x, o in zip(xs[i % copies], outs[i % copies]):
      o.copy_(x)

  row = {"shape": [b, t, n, 128], "bytes": float(nbytes)}
  for name, fn in (("pass", quantize), ("copy", copy)):
    ms = graph_replay_ms(fn, calls=20, replays=7)
    row[f"{name}_ms"], row[f"{name}_tbs"] = ms, nbytes / 1e9 / ms
  return row


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="quantize_pass.json")
  args = ap.parse_args()
  import torch

  result = {"benchmark": "quantize_pass", "device": torch.cuda.get_device_name(), "rows": []}
  for shape in SHAPES:
    row = time_shape(*shape)
    print(json.dumps(row), flush=True)
    result["rows"].append(row)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
