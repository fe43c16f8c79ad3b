"""test_tensor_kernels_nan_and_inf's final assertions, offline: the H200 kernels' outputs (run 38d's .npz, argv[1])
against the reference computed on the CPU backend (the run38_tensor_inf_debug.py .npz of a CPU run, argv[2]), whose
Q, K, V and O, O' run 38f found bit-identical to the fixed reference on the GPU."""
import sys
sys.path.insert(0, "tests")
import numpy as np
from conftest import assert_close
from test_numerics_modes_triton import BOUNDS, _zero_empty_rows

gpu, cpu = np.load(sys.argv[1]), np.load(sys.argv[2])
keys = ("O", "O'", "lse", "dQ", "dK", "dV")
got = {k: gpu[f"got_{k}"] for k in keys}
ref = {k: cpu[f"ref_{k}"] for k in keys}
for k in keys:
  assert np.isnan(got[k][0]).all() and np.isnan(ref[k][0]).all(), k
got, ref = ({k: x[1:].copy() for k, x in d.items()} for d in (got, ref))
_zero_empty_rows(got, ref)
for k in keys:
  print(k, "relative error %.3e (bound %.0e)" % (assert_close(got[k], ref[k], rel=BOUNDS[k], name=k), BOUNDS[k]))
print("all within bounds")
