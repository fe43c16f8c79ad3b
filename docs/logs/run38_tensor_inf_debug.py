"""test_tensor_kernels_nan_and_inf's inputs (tests/test_numerics_modes_triton.py) through the same kernels and
reference: per (output, batch 1, head, query row) the largest |got - ref|, and the arrays as .npz (argv[1])."""
import sys
sys.path.insert(0, "tests")
import numpy as np, torch
import test_numerics_modes_triton as T

c = T.TENSOR_CASES["lengths-gqa"]
rng = np.random.default_rng(2)
q, k, v, do = (rng.normal(0, 1, s).astype(np.float32) * sp for s, sp in
               zip(((2, 20, 2, 32), (2, 33, 1, 32), (2, 33, 1, 32), (2, 20, 2, 32)), (1.0, 0.1, 1.0, 1.0)))
k[0, 3, 0, 0] = np.nan
k[1, 20, 0, 5] = np.nan
q[1, 2, 1, 7] = np.inf
arrays = [torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v, do)]
got, ref, scratch = T._tensor_run(c, arrays, T.TENSOR_SCALE["lengths-gqa"])
print("masks", c["masks"])
for key in got:
  g, r = got[key][1], ref[key][1]
  d = np.abs(np.nan_to_num(g - r, nan=1e9, posinf=1e9, neginf=1e9))
  print(key, g.shape, "max", d.max())
  if d.ndim == 3:  # [T, H, D]
    d = d.max(-1)
  if key in ("O", "lse"):
    bad = np.argwhere(d > 1e-2 * max(np.abs(np.nan_to_num(r)).max(), 1e-30))
    print("  bad", bad.tolist()[:20])
np.savez(sys.argv[1], **{f"got_{k}": x for k, x in got.items()}, **{f"ref_{k}": x for k, x in ref.items()},
         **{f"scratch_{k}": x for k, x in scratch.items()})
