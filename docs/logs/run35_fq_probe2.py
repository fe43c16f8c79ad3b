"""Why run35_fq_probe.py saw 'bits DIFF' between launch configurations of fake_quantize_rows_kernel: every
configuration against the independent oracle (tests/oracle.py fq_oracle), NaN payloads normalized and raw,
for this tree's nvfp4.py and main's (.device/mainkern/nvfp4.py). [4096, 128] bf16 with a NaN, +-Inf, -0."""
import importlib.util, sys
import numpy as np, torch, triton
sys.path.insert(0, "tests")
from oracle import fq_oracle

def load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
  return mod

rows, cols = 4096, 128
g = torch.Generator(device="cuda").manual_seed(0)
x = (torch.randn(rows, cols, device="cuda", generator=g) * 3).to(torch.bfloat16)
x[5, 3] = float("nan"); x[7, 100] = float("inf"); x[9, 17] = -float("inf"); x[11, 40] = -0.0
want = fq_oracle(x.float().cpu().numpy()).astype(np.float32)
want_bf = torch.from_numpy(want).to(torch.bfloat16).view(torch.int16).numpy()
nan_w = np.isnan(want)
for label, path in (("new", "kernels_triton/nvfp4.py"), ("main", ".device/mainkern/nvfp4.py")):
  knv = load(path, "nv_" + label)
  for block_r in (8, 16, 32, 64):
    for warps in (2, 4, 8):
      out = torch.empty_like(x)
      knv.fake_quantize_rows_kernel[(triton.cdiv(rows, block_r), 1)](x, rows, cols, cols, cols, out, BLOCK_R=block_r,
                                                                     BLOCK_C=128, HW_E4M3=True, HW_E2M1=False,
                                                                     num_warps=warps, num_stages=1)
      got = out.view(torch.int16).cpu().numpy()
      got_f = out.float().cpu().numpy()
      nan_g = np.isnan(got_f)
      value_bad = (~nan_w & (got != want_bf)) | (nan_w != nan_g)
      raw_bad = got != want_bf
      where = np.argwhere(value_bad)[:4].tolist()
      print(f"{label} BLOCK_R={block_r:3d} warps={warps}: value mismatches {int(value_bad.sum())} {where}  "
            f"raw-bit mismatches {int(raw_bad.sum())} (NaN positions: {int((raw_bad & nan_w).sum())}) "
            f"NaN bits {sorted(set(hex(int(v) & 0xFFFF) for v in got[nan_g]))}", flush=True)
