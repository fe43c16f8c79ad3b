"""Launch configurations of the standalone NVFP4 pass (fake_quantize_rows_kernel, the kept quantizer) on one
[16384 * 16, D] bf16 tensor (K of the (1, 16, 16384, D) benchmarks) for D = 64, 128, 256, against a device
copy of the same bytes; every output compared bit for bit (NaN payload included) with the default
configuration's. CUDA events, median of 5 repeats of 50 launches. Prints one JSON line per configuration."""
import json, statistics, torch, triton
from jqat.kernels_triton import nvfp4 as knv

def timed(fn, n=50, reps=5):
  fn(); torch.cuda.synchronize()
  out = []
  for _ in range(reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
      fn()
    b.record(); torch.cuda.synchronize()
    out.append(a.elapsed_time(b) / n)
  return statistics.median(out)

for cols in (128, 64, 256):
  rows = 16384 * 16
  x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
  x[5, 3] = float("nan"); x[7, 60] = float("inf"); x[9, 17] = -0.0
  y = torch.empty_like(x)
  copy = timed(lambda: y.copy_(x))
  grid0, kw0 = knv.fake_quantize_launch(rows, cols)
  def run(out, block_r, block_c, warps):
    knv.fake_quantize_rows_kernel[(triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))](
        x, rows, cols, cols, cols, out, BLOCK_R=block_r, BLOCK_C=block_c, HW_E4M3=True, HW_E2M1=False,
        num_warps=warps, num_stages=1)
  ref = torch.empty_like(x)
  run(ref, kw0["BLOCK_R"], kw0["BLOCK_C"], kw0["num_warps"])
  for block_c in sorted({min(cols, 128), cols}):
    for per_thread in (4, 8, 16, 32):
      for warps in (1, 2, 4, 8):
        block_r = per_thread * 32 * warps // block_c
        if block_r < 1 or block_r > 256:
          continue
        out = torch.empty_like(x)
        t = timed(lambda: run(out, block_r, block_c, warps))
        same = torch.equal(out.view(torch.int16), ref.view(torch.int16))
        print(json.dumps({"D": cols, "BLOCK_R": block_r, "BLOCK_C": block_c, "warps": warps,
                          "per_thread": per_thread, "us": round(t * 1e3, 1), "copy_us": round(copy * 1e3, 1),
                          "bits_same": same, "default": (block_r, block_c, warps) == (kw0["BLOCK_R"], kw0["BLOCK_C"],
                                                                                  kw0["num_warps"])}), flush=True)
