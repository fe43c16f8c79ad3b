"""The XLA reference of qkv_scale="tensor" on the GPU against the same jitted program on the CPU backend, for
test_tensor_kernels_nan_and_inf's inputs and variants without its NaN / Inf: which input makes them differ, and
in which of Q, K, V (the reference's _inputs) or the forward's outputs."""
import sys
sys.path.insert(0, "tests")
import numpy as np, jax, jax.numpy as jnp
from jqat._src import attention_reference as R
from jqat.ffi.options import QATConfig

rng = np.random.default_rng(2)
base = [rng.normal(0, 1, s).astype(np.float32) * sp for s, sp in
        zip(((2, 20, 2, 32), (2, 33, 1, 32), (2, 33, 1, 32)), (1.0, 0.1, 1.0))]
masks_np = (np.array([20, 13], np.int32), np.array([33, 9], np.int32), None, None)
cfg = QATConfig()
cpu, gpu = jax.devices("cpu")[0], jax.devices()[0]


def variant(k_nan0, k_nan1, q_inf):
  q, k, v = (x.copy() for x in base)
  if k_nan0: k[0, 3, 0, 0] = np.nan
  if k_nan1: k[1, 20, 0, 5] = np.nan
  if q_inf: q[1, 2, 1, 7] = np.inf
  return [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]


inputs = jax.jit(lambda q, k, v, m: R._inputs(q, k, v, cfg, "tensor", m))
fwd = jax.jit(lambda q, k, v, m: R.forward(q, k, v, scale=32**-0.5 * 3.0, is_causal=False, block_n=16, cfg=cfg,
                                           masks=m, qkv_scale="tensor"))
scales = jax.jit(lambda x, n: R.tensor_scale(x, n))
for flags in [(1, 1, 1), (0, 1, 1), (1, 0, 1), (1, 1, 0), (0, 0, 1), (0, 0, 0)]:
  arrays = variant(*flags)
  res = {}
  for dev in (cpu, gpu):
    a = [jax.device_put(x, dev) for x in arrays]
    m = tuple(None if x is None else jax.device_put(jnp.asarray(x), dev) for x in masks_np)
    res[dev.platform] = ([np.asarray(x) for x in inputs(*a, m)], [np.asarray(x, np.float32) for x in fwd(*a, m)],
                         [np.asarray(scales(a[i], m[0 if i == 0 else 1])) for i in range(3)])
  c, g = res["cpu"], res["gpu"]
  diff = lambda x, y: float(np.nanmax(np.abs(x[1] - y[1]))) if not np.array_equal(np.isnan(x[1]), np.isnan(y[1])) \
      or np.nanmax(np.abs(x[1] - y[1])) > 0 else 0.0
  print("k_nan_b0 k_nan_b1_past_len q_inf_b1 =", flags,
        "| batch 1 max |gpu - cpu|: Q K V", [diff(x, y) for x, y in zip(c[0], g[0])],
        "O O' lse", [diff(x, y) for x, y in zip(c[1], g[1])],
        "| enc q k v cpu", [x[1].ravel().tolist() for x in c[2]], "gpu", [x[1].ravel().tolist() for x in g[2]],
        flush=True)
