"""Launch configurations of the standalone NVFP4 pass (fake_quantize_rows_kernel) on one [16384 * 16, 128] bf16
tensor (K of the (1, 16, 16384, 128) benchmarks), against a device copy of the same bytes; outputs compared bit
for bit with the default configuration. CUDA events, median of 5 repeats of 50 launches."""
import statistics, sys, torch, triton
from jqat.kernels_triton import nvfp4 as knv

rows, cols = 16384 * 16, 128
x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
x[5, 3] = float("nan"); x[7, 100] = float("inf")

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

y = torch.empty_like(x)
print(f"copy: {timed(lambda: y.copy_(x)) * 1e3:.1f} us", flush=True)
grid0, kw0 = knv.fake_quantize_launch(rows, cols)
ref = torch.empty_like(x)
def run(out, block_r, warps):
  knv.fake_quantize_rows_kernel[(triton.cdiv(rows, block_r), 1)](x, rows, cols, cols, cols, out, BLOCK_R=block_r,
                                                                 BLOCK_C=128, HW_E4M3=True, HW_E2M1=False,
                                                                 num_warps=warps, num_stages=1)
run(ref, kw0["BLOCK_R"], kw0["num_warps"])
for block_r in (8, 16, 32, 64):
  for warps in (2, 4, 8):
    out = torch.empty_like(x)
    t = timed(lambda: run(out, block_r, warps))
    same = torch.equal(out.view(torch.int16), ref.view(torch.int16))
    print(f"BLOCK_R={block_r:3d} warps={warps}: {t * 1e3:6.1f} us  bits {'same' if same else 'DIFF'}"
          + ("  (default)" if (block_r, warps) == (kw0["BLOCK_R"], kw0["num_warps"]) else ""), flush=True)
