"""jqat.nvfp4.qat_matmul: the reference against a float64 NumPy re-derivation, the Pallas kernel
(interpret mode on the CPU, compiled on the GPU) against the reference, the straight-through
gradients, dispatch and input validation.

Tolerance: every implementation multiplies fq values exactly (at most 6 significant bits each) and
sums K products in FP32 in some order, then rounds once to the output dtype. A sum of K terms in
any order is within (K - 1) * 2**-24 * sum|terms| of the exact sum, so two implementations differ
by at most twice that, plus one rounding step of the output dtype each; a reference against the
exact float64 sum by half as much. This elementwise bound is the check; a skipped or misplaced
quantization moves values by ~10%, far past it.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from oracle import fq_oracle
from test_nvfp4_pallas import compile_for_sm90

from jqat import nvfp4
from jqat._src.qat_matmul import Config, qat_matmul_pallas, qat_matmul_reference

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
MANTISSA = {np.dtype(np.float32): 23, np.dtype(ml_dtypes.bfloat16): 7, np.dtype(np.float16): 10}
SMALL = Config(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=2)


def operands(m, k, n, dtype, seed=0, scale=3.0):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((m, k)) * scale).astype(dtype)
  w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
  return x, w


def exact_product(a, b, a_axis, b_axis):
  """Float64 ``fq(a) @ fq(b)`` and ``|fq(a)| @ |fq(b)|`` (the sum of |terms| per element)."""
  aq = fq_oracle(a, axis=a_axis).astype(np.float64)
  bq = fq_oracle(b, axis=b_axis).astype(np.float64)
  return aq @ bq, np.abs(aq) @ np.abs(bq)


def assert_within_accumulation(actual, expected, abs_sum, k, *, sides, name="y"):
  """|actual - expected| <= sides * ((k - 1) * 2**-24 * abs_sum + half a rounding step of actual's dtype)."""
  a = np.asarray(actual, np.float64)
  e = np.asarray(expected, np.float64)
  assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
  assert (np.isnan(a) == np.isnan(e)).all(), f"{name}: NaN at different positions"
  ok = ~np.isnan(e)
  big = np.maximum(np.abs(a), np.abs(e))[ok]
  half_ulp = np.exp2(np.floor(np.log2(np.maximum(big, 2.0**-100))) - MANTISSA[np.dtype(np.asarray(actual).dtype)] - 1)
  bound = sides * (max(k - 1, 0) * 2.0**-24 * abs_sum[ok] + half_ulp)
  err = np.abs(a[ok] - e[ok])
  worst = (err / bound).max(initial=0.0)
  assert (err <= bound).all(), f"{name}: {(err > bound).sum()} elements past the bound (worst {worst:.2f}x)"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, n", [(1, 16, 1), (20, 48, 24), (37, 128, 40)])
def test_reference_against_float64(m, k, n, dtype):
  x, w = operands(m, k, n, dtype)
  exact, abs_sum = exact_product(x, w, -1, 0)
  y = jax.jit(qat_matmul_reference)(x, w)
  assert y.dtype == dtype
  assert_within_accumulation(y, exact, abs_sum, k, sides=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, n", [(1, 16, 1), (20, 48, 24), (37, 144, 40), (64, 96, 64)])
def test_pallas_interpret_against_reference(m, k, n, dtype):
  """Odd M and N (padded to tiles), K not a multiple of block_k (padded with zero blocks)."""
  x, w = operands(m, k, n, dtype, seed=1)
  x[min(3, m - 1), 5] = np.nan  # poisons its block, hence its whole output row
  _, abs_sum = exact_product(np.nan_to_num(x), w, -1, 0)
  y = jax.jit(lambda x, w: qat_matmul_pallas(x, w, SMALL, interpret=True))(x, w)
  ref = jax.jit(qat_matmul_reference)(x, w)
  assert np.isnan(np.asarray(y, np.float32)[min(3, m - 1)]).all()
  assert_within_accumulation(y, ref, abs_sum, k, sides=2)


def test_public_entry_point_leading_axes_and_mixed_dtypes():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((2, 3, 64)).astype(ml_dtypes.bfloat16)
  w = rng.standard_normal((64, 24)).astype(np.float32)
  for implementation in ("xla", "pallas"):
    y = nvfp4.qat_matmul(x, w, implementation=implementation, config=SMALL)
    assert y.shape == (2, 3, 24) and y.dtype == jnp.bfloat16
    exact, abs_sum = exact_product(x.reshape(6, 64), w, -1, 0)
    assert_within_accumulation(np.asarray(y).reshape(6, 24), exact, abs_sum, 64, sides=1)


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_gradients_are_the_straight_through_estimator(implementation):
  """dX = dY @ fq(W)^T and dW = fq(X)^T @ dY, against float64 with the accumulation bound."""
  m, k, n = 24, 64, 40
  x, w = operands(m, k, n, np.float32, seed=3)
  dy = np.random.default_rng(4).standard_normal((m, n)).astype(np.float32)
  loss = lambda x, w: jnp.sum(nvfp4.qat_matmul(x, w, implementation=implementation, config=SMALL) * dy)
  dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
  xq = fq_oracle(x, axis=-1).astype(np.float64)
  wq = fq_oracle(w, axis=0).astype(np.float64)
  d64 = dy.astype(np.float64)
  assert_within_accumulation(dx, d64 @ wq.T, np.abs(d64) @ np.abs(wq.T), n, sides=1, name="dx")
  assert_within_accumulation(dw, xq.T @ d64, np.abs(xq.T) @ np.abs(d64), m, sides=1, name="dw")


def test_dispatch():
  x, w = operands(16, 32, 16, np.float32)
  has_pallas = lambda impl: "pallas_call" in str(jax.make_jaxpr(lambda x, w: nvfp4.qat_matmul(
      x, w, implementation=impl))(x, w))
  assert has_pallas("pallas") and not has_pallas("xla")
  on_gpu = jax.devices()[0].platform == "gpu"
  assert has_pallas(None) == on_gpu


def test_vmap_and_zero_rows():
  x, w = operands(12, 32, 16, ml_dtypes.bfloat16, seed=5)
  xs = np.stack([x, -x])
  y = jax.vmap(lambda x: nvfp4.qat_matmul(x, w, implementation="pallas", config=SMALL))(xs)
  exact, abs_sum = exact_product(x, w, -1, 0)
  assert_within_accumulation(y[0], exact, abs_sum, 32, sides=1)
  assert_within_accumulation(y[1], -exact, abs_sum, 32, sides=1)
  empty = nvfp4.qat_matmul(np.zeros((0, 32), np.float32), w.astype(np.float32), implementation="pallas")
  assert empty.shape == (0, 16) and empty.dtype == jnp.float32


def test_validation_names_the_argument():
  x = jnp.ones((4, 32), jnp.bfloat16)
  w = jnp.ones((32, 8), jnp.bfloat16)
  cases = [
      (lambda: nvfp4.qat_matmul(x.astype(jnp.int32), w), TypeError, "x must be float32"),
      (lambda: nvfp4.qat_matmul(x, w.astype(jnp.int8)), TypeError, "w must be float32"),
      (lambda: nvfp4.qat_matmul(jnp.ones((), jnp.bfloat16), w), ValueError, "x must have rank >= 1"),
      (lambda: nvfp4.qat_matmul(x, w[0]), ValueError, "w must have rank 2"),
      (lambda: nvfp4.qat_matmul(x, w[:16]), ValueError, r"w.shape\[0\] must equal x.shape\[-1\] = 32"),
      (lambda: nvfp4.qat_matmul(x[:, :24], w[:24]), ValueError, "must be a multiple of 16, got 24"),
      (lambda: nvfp4.qat_matmul(x, w, implementation="triton"), ValueError, "implementation must be one of"),
      (lambda: nvfp4.qat_matmul(x, w, config=(64, 64, 64)), TypeError, "config must be"),
      (lambda: Config(block_m=48), ValueError, "block_m must be a power of two"),
  ]
  for fn, exc, match in cases:
    with pytest.raises(exc, match=match):
      fn()


@pytest.mark.fresh_process
def test_kernel_compiles_for_sm90(tmp_path):
  """The default launch config through Pallas' Triton lowering to an sm_90 cubin, on the CPU."""
  x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
  cfg = Config()
  [kernel] = compile_for_sm90(lambda x, w: qat_matmul_pallas(x, w, cfg), x, w, tmp_path=tmp_path,
                              num_warps=cfg.num_warps, num_stages=cfg.num_stages)
  assert kernel.asm["cubin"]
  assert kernel.metadata.shared <= 227 * 1024  # fits an H100/H200 SM


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, n", [(37, 144, 40), (512, 1024, 768), (1000, 4096, 1024)])
def test_compiled_pallas_on_gpu(m, k, n, dtype):
  x, w = operands(m, k, n, dtype, seed=6)
  x[3, 5] = np.nan
  _, abs_sum = exact_product(np.nan_to_num(x), w, -1, 0)
  y = jax.jit(lambda x, w: nvfp4.qat_matmul(x, w))(x, w)
  ref = jax.jit(lambda x, w: nvfp4.qat_matmul(x, w, implementation="xla"))(x, w)
  assert_within_accumulation(y, ref, abs_sum, k, sides=2)


@pytest.mark.gpu
def test_gradients_on_gpu():
  m, k, n = 256, 512, 384
  x, w = operands(m, k, n, ml_dtypes.bfloat16, seed=7)
  dy = np.random.default_rng(8).standard_normal((m, n)).astype(ml_dtypes.bfloat16)
  loss = lambda x, w: jnp.sum(nvfp4.qat_matmul(x, w).astype(jnp.float32) * dy.astype(np.float32))
  dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
  xq = fq_oracle(x, axis=-1).astype(np.float64)
  wq = fq_oracle(w, axis=0).astype(np.float64)
  d64 = dy.astype(np.float64)
  assert_within_accumulation(dx, d64 @ wq.T, np.abs(d64) @ np.abs(wq.T), n, sides=1, name="dx")
  assert_within_accumulation(dw, xq.T @ d64, np.abs(xq.T) @ np.abs(d64), m, sides=1, name="dw")


def test_example_runs(capsys):
  """examples/pallas_qat_linear.py: the in-kernel quantize matches, and QAT training lowers the loss."""
  import runpy

  path = __file__.replace("tests/test_qat_matmul.py", "examples/pallas_qat_linear.py")
  runpy.run_path(path, run_name="__main__")
  out = capsys.readouterr().out
  assert "kernel quantize == nvfp4.quantize: True" in out
  first, last = (float(v) for v in out.split("QAT MLP loss: ")[1].split(" after")[0].split(" -> "))
  assert last < 0.5 * first
