"""jqat.nvfp4.qat_matmul: the quantize passes bit for bit against jqat.nvfp4.fake_quantize, the product against a
float64 NumPy re-derivation, the straight-through gradients from the forward's quantized operands, vmap, dispatch,
validation, the launch plans, the sm_90 build of the passes and the import order of the two modules.

CPU: the Triton passes run in Triton's interpreter through the JAX binding's callback launcher (``triton_here``);
GPU (``@pytest.mark.gpu``): compiled, at LLM-sized operands.

Tolerance of the products (``assert_product``, through conftest's ``assert_close``): fq values are exact in BF16,
so every product of two of them (or of one and a BF16 dY) is exact in FP32, and the only errors are the FP32
summation of K terms, at most ``K * 2**-24 * sum|terms|`` per element in any order (Frobenius: the same with
``||sum|terms| ||``), and the one rounding to the output dtype, ``2**-(mantissa + 1)`` relative. The bound is
that sum, computed from the data; a skipped or misplaced quantization moves values by ~10%, far past it.
"""

import os
import subprocess
import sys

import jax
import jax.extend
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import assert_close
from oracle import fq_oracle
from test_nvfp4_pallas import boundary_blocks

from jqat import nvfp4
from jqat._src import dispatch
from jqat._src import qat_matmul as qm
from jqat.ffi import callback_launch, jax_launch
from jqat.ffi import plan as plans

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
BF16 = ml_dtypes.bfloat16
DTYPES = [np.float32, BF16, np.float16]
MANTISSA = {np.dtype(np.float32): 23, np.dtype(BF16): 7, np.dtype(np.float16): 10}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def triton_here(monkeypatch):
  """``implementation="triton"`` wherever the test runs: on the CPU the callback launcher runs the passes in
  Triton's interpreter (the dispatcher is told the Triton path can run)."""
  if INTERPRET:
    pytest.importorskip("torch")  # the interpreter's buffers are torch views
    monkeypatch.setenv(callback_launch.ENV, "callback")
    monkeypatch.setattr(dispatch, "triton_unavailable_reason", lambda: None)


def u16(a):
  return np.asarray(a).view(np.uint16)


def assert_bitwise(got, want, name):
  bad = u16(got) != u16(want)
  assert not bad.any(), f"{name}: {bad.sum()} of {bad.size} differ, first at {np.argwhere(bad)[:3].tolist()}"


def scaled_normal(shape, dtype, axis, seed, exponents=(-8, 4)):
  """Normal values, each block of 16 along ``axis`` scaled by its own 2**e, e in ``exponents`` (inclusive): block
  scales over much of E4M3's range, products within FP16's."""
  rng = np.random.default_rng(seed)
  blocks = list(shape)
  blocks[axis] //= 16
  e = np.repeat(rng.integers(exponents[0], exponents[1] + 1, blocks), 16, axis=axis)
  return (rng.standard_normal(shape) * np.exp2(e)).astype(dtype)


def exact_product(a, b, contract):
  """float64 ``a . b`` and ``|a| . |b|`` over ``contract`` (np.tensordot axes) of exactly representable operands."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.tensordot(a, b, contract), np.tensordot(np.abs(a), np.abs(b), contract)


def assert_product(actual, exact, abs_sum, k, name):
  """``actual`` (a product over ``k`` terms rounded to its dtype) against float64 ``exact``: NaN at the same
  positions; elsewhere the module docstring's bound on the Frobenius-relative error."""
  a = np.asarray(actual)
  got = a.astype(np.float64)
  assert got.shape == exact.shape, f"{name}: shape {got.shape} != {exact.shape}"
  nan = np.isnan(exact)
  np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{name}: NaN positions")
  ok = ~nan
  # A planted Inf in x and in w fake-quantizes to +-2688 each: their product overflows FP16 and must round to +-Inf.
  # (No exact value sits in the ambiguous band between the largest finite value and twice it.)
  top = float(ml_dtypes.finfo(a.dtype).max)
  over = ok & (np.abs(exact) > 2 * top)
  assert not (ok & (np.abs(exact) > top) & ~over).any(), f"{name}: an exact value near the overflow threshold"
  np.testing.assert_array_equal(got[over], np.sign(exact[over]) * np.inf, err_msg=f"{name}: overflow to +-Inf")
  ok &= ~over
  acc = k * 2.0**-24 * np.linalg.norm(abs_sum[ok]) / max(np.linalg.norm(exact[ok]), 1e-300)
  rel = 2.0 ** -(MANTISSA[a.dtype] + 1) * (1 + acc) + acc
  assert_close(got[ok], exact[ok], rel=rel, name=name)


def fq64(a, axis):
  return fq_oracle(a, axis=axis).astype(np.float64)


# ----------------------------------------------------------------------------- the quantize passes


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the interpreter's max over a NaN block
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_passes_are_fake_quantize(triton_here, dtype):
  """fq(x) along the last axis and fq(w) along axis 0, from the passes, are jqat.nvfp4.fake_quantize's values in
  BF16 bit for bit (and the oracle's), on blocks holding every E2M1 tie and E4M3 midpoint, NaN, +-Inf, signed
  zeros and the 2**-9 floor (tests/test_nvfp4_pallas.py's ``boundary_blocks``), with tails: rows not a multiple
  of the tile, K not of BLOCK_C, N not of BLOCK_C nor of 16 (the 4- and 8-element stride hints), two tiles along N,
  a rank-3 x."""
  xb, wb = boundary_blocks(dtype, 1), boundary_blocks(dtype, 0)  # [64, 128], blocks along axis 1 / axis 0
  cases = [(-1, xb[:37, :80]), (-1, xb[:30].reshape(2, 15, 128)),
           (0, wb), (0, wb[:48, :100]), (0, np.concatenate([wb, -wb[:, ::-1]], axis=1)[:, :200])]
  for axis, a in cases:
    got = jax.jit(lambda a, axis=axis: jax_launch.fake_quantize(a, axis))(a)
    assert got.dtype == jnp.bfloat16 and got.shape == a.shape
    name = f"fq axis {axis} of {a.shape} {np.dtype(dtype).name}"
    want = jax.jit(lambda a, axis=axis: nvfp4.fake_quantize(a, axis=axis).astype(jnp.bfloat16))(a)
    assert_bitwise(got, want, name)
    assert_bitwise(got, fq_oracle(a, axis=axis).astype(BF16), name + " (oracle)")


# ----------------------------------------------------------------------------- the product and its gradients


@pytest.mark.parametrize("impl", ["xla", "triton"])
@pytest.mark.parametrize("x_dtype, w_dtype", [(BF16, BF16), (np.float32, np.float16), (np.float16, np.float32)])
def test_product_against_float64(triton_here, impl, x_dtype, w_dtype):
  """x [3, 13, 64] (K = 64), w [64, 40]: [3, 13, 40] in x's dtype; a NaN in x's block makes its output row NaN,
  one in w's block its column."""
  x = scaled_normal((3, 13, 64), x_dtype, -1, 1)
  w = scaled_normal((64, 40), w_dtype, 0, 2, (-10, 0))
  x[1, 2, 5], w[20, 7] = np.nan, np.nan
  y = jax.jit(lambda x, w: nvfp4.qat_matmul(x, w, implementation=impl))(x, w)
  assert y.shape == (3, 13, 40) and y.dtype == x_dtype
  exact, abs_sum = exact_product(fq64(x, -1), fq64(w, 0), 1)
  assert np.isnan(exact[1, 2]).all() and np.isnan(exact[..., 7]).all()
  assert_product(y, exact, abs_sum, 64, f"{impl} y")


@pytest.mark.parametrize("impl", ["xla", "triton"])
def test_gradients_are_the_straight_through_estimator(triton_here, impl):
  """dX = dY @ fq(W)^T (x's dtype), dW = fq(X)^T @ dY (w's dtype) against float64; the backward quantizes nothing
  (its jaxpr: two dots, no reduction, no kernel launch), because the forward's fq(x), fq(w) are the residuals."""
  x = scaled_normal((2, 9, 48), BF16, -1, 3)
  w = scaled_normal((48, 24), np.float32, 0, 4)
  dy = np.random.default_rng(5).standard_normal((2, 9, 24)).astype(BF16)
  f = jax.jit(lambda x, w: nvfp4.qat_matmul(x, w, implementation=impl))
  _, vjp = jax.vjp(f, x, w)
  dx, dw = jax.jit(vjp)(dy)
  assert (dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.float32)
  xq, wq, d = fq64(x, -1), fq64(w, 0), dy.astype(np.float64)
  assert_product(dx, *exact_product(d, wq, ([2], [1])), 24, "dx")
  assert_product(dw, *exact_product(xq, d, ([0, 1], [0, 1])), 18, "dw")
  prims = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      prims.append(eqn.primitive.name)
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jax.make_jaxpr(vjp)(dy).jaxpr)
  assert prims.count("dot_general") == 2, prims
  assert not [p for p in prims if "reduce" in p or "custom" in p or "callback" in p or "triton" in p], prims


def test_vmap_over_either_operand_and_empty_operands(triton_here):
  """vmap over stacked inputs (folded into the passes' rows) and stacked weights (folded along K: a block never
  straddles two matrices), against float64; empty M, K or N give zeros."""
  x = scaled_normal((2, 5, 32), BF16, -1, 6)
  w = scaled_normal((3, 32, 24), BF16, 1, 7)
  f = lambda x, w: nvfp4.qat_matmul(x, w, implementation="triton")
  wq = np.stack([fq64(m, 0) for m in w])
  ys = jax.jit(jax.vmap(f))(x, w[:2])
  for i in range(2):
    assert_product(ys[i], *exact_product(fq64(x[i], -1), wq[i], 1), 32, f"vmap over both, {i}")
  ys = jax.jit(jax.vmap(f, in_axes=(None, 0)))(x[0], w)
  for i in range(3):
    assert_product(ys[i], *exact_product(fq64(x[0], -1), wq[i], 1), 32, f"vmap over w, {i}")
  for xs, ws in (((0, 32), (32, 8)), ((4, 0), (0, 8)), ((4, 32), (32, 0))):
    y, (dx, dw) = jax.value_and_grad(lambda x, w: f(x, w).sum(), argnums=(0, 1))(np.ones(xs, np.float32),
                                                                                np.ones(ws, np.float32))
    assert not y and dx.shape == xs and dw.shape == ws and not np.asarray(dx).any() and not np.asarray(dw).any()


# ----------------------------------------------------------------------------- dispatch, validation, plans, imports


def _launches_passes(implementation, x, w) -> bool:
  """The op's jaxpr holds the passes (each a custom_vmap call of the JAX binding)."""
  return "custom_vmap_call" in str(jax.make_jaxpr(lambda x, w: nvfp4.qat_matmul(x, w, implementation=implementation))(
      x, w))


def test_dispatch_and_validation(monkeypatch):
  x = jnp.ones((4, 32), jnp.bfloat16)
  w = jnp.ones((32, 8), jnp.bfloat16)
  on_gpu = dispatch.triton_unavailable_reason() is None
  assert _launches_passes(None, x, w) == on_gpu and not _launches_passes("xla", x, w)
  if not on_gpu:
    with pytest.raises(RuntimeError, match="implementation='triton' cannot run here"):
      nvfp4.qat_matmul(x, w, implementation="triton")
    monkeypatch.setenv(callback_launch.ENV, "callback")
    monkeypatch.setattr(dispatch, "triton_unavailable_reason", lambda: None)
    assert _launches_passes(None, x, w) and _launches_passes("triton", x, w)
  cases = [
      (lambda: nvfp4.qat_matmul(x.astype(jnp.int32), w), TypeError, "x must be float32"),
      (lambda: nvfp4.qat_matmul(x, w.astype(jnp.int8)), TypeError, "w must be float32"),
      (lambda: nvfp4.qat_matmul(jnp.ones((), jnp.bfloat16), w), ValueError, "x must have rank >= 1"),
      (lambda: nvfp4.qat_matmul(x, w[0]), ValueError, "w must have rank 2"),
      (lambda: nvfp4.qat_matmul(x, w[:16]), ValueError, r"w.shape\[0\] must equal x.shape\[-1\] = 32"),
      (lambda: nvfp4.qat_matmul(x[:, :24], w[:24]), ValueError, "must be a multiple of 16, got 24"),
      (lambda: nvfp4.qat_matmul(x, w, implementation="cuda"), ValueError, "implementation must be one of"),
      (lambda: nvfp4.qat_matmul(x, w, implementation="pallas"), ValueError, "'pallas' was removed.*'triton'"),
      (lambda: nvfp4.qat_matmul(x, w, config=(64, 64, 64)), TypeError, "config must be None"),
  ]
  for fn, exc, match in cases:
    with pytest.raises(exc, match=match):
      fn()


def test_plans_of_the_passes():
  """Tiles, masks and the stride hint of the passes as the plans decide them (no launch)."""
  gpu = plans.Target((9, 0))
  (launch,) = plans.fake_quantize_columns(plans.Tensor.dense((4096, 14336), "bfloat16"), gpu).launches
  assert launch.grid == (256, 112) and (launch.num_warps, launch.num_stages) == (4, 1)
  assert {k: launch.constexprs[k] for k in ("BLOCK_R", "BLOCK_C", "EVEN", "ALIGN", "HW_E4M3")} == dict(
      BLOCK_R=16, BLOCK_C=128, EVEN=True, ALIGN=16, HW_E4M3=True)
  # N = 40: a tail tile and 8-element alignment; K = 48 in tiles of 32 rows, the last one half masked.
  (launch,) = plans.fake_quantize_columns(plans.Tensor.dense((48, 40), "float32"), gpu, "bfloat16").launches
  assert launch.grid == (2, 1) and launch.args[1:] == (48, 40, 40, 40)
  assert (launch.constexprs["BLOCK_R"], launch.constexprs["BLOCK_C"], launch.constexprs["EVEN"],
          launch.constexprs["ALIGN"]) == (32, 64, False, 8)
  # A w with padded rows (stride 48) keeps its layout: read with its stride, written dense.
  plan = plans.fake_quantize_columns(plans.Tensor((32, 40), "bfloat16", (48, 1)), gpu)
  assert plan.launches[0].args[1:] == (32, 40, 48, 40) and plan.buffers["w_hat"].strides == (40, 1)
  rows = plans.fake_quantize_rows(plans.Tensor.dense((3, 100, 64), "float32"), gpu)
  (launch,) = rows.launches
  assert launch.kernel is plans.knv.fake_quantize_rows_kernel and launch.args[1:] == (300, 64, 64, 64)
  assert rows.buffers["x_hat"] == plans.Tensor.dense((3, 100, 64), "bfloat16")
  for plan in (plans.fake_quantize_rows(plans.Tensor.dense((0, 64), "bfloat16"), gpu),
               plans.fake_quantize_columns(plans.Tensor.dense((32, 0), "bfloat16"), gpu)):
    assert not plan.launches and plan.fills == {plan.outputs[0]: 0.0}
  with pytest.raises(ValueError, match="multiple of 16"):
    plans.fake_quantize_columns(plans.Tensor.dense((24, 8), "bfloat16"), gpu)
  with pytest.raises(ValueError, match="2-D with a contiguous last axis"):
    plans.fake_quantize_columns(plans.Tensor((32, 8), "bfloat16", (1, 32)), gpu)
  with pytest.raises(ValueError, match="dtypes must be among"):
    plans.fake_quantize_rows(plans.Tensor.dense((4, 32), "bfloat16"), gpu, "float8_e4m3fn")


def test_no_import_circle():
  """The quantizer (jqat._src.nvfp4) imports neither the linear layer nor the public module; jqat.nvfp4 names both.
  Each module imports first on its own in a fresh process (a circle raised ImportError from a partially initialized
  module)."""
  import ast

  for first in ("jqat._src.qat_matmul", "jqat._src.nvfp4", "jqat.nvfp4"):
    code = (f"import {first}\nimport jqat._src.qat_matmul as m, jqat.nvfp4 as n\n"
            "assert n.qat_matmul is m.qat_matmul\nprint('RESULT ok')\n")
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert "RESULT ok" in proc.stdout, (first, proc.stderr[-3000:])
  from jqat._src import nvfp4 as quantizer

  tree = ast.parse(open(quantizer.__file__).read())
  imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
      a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
  assert not [n for n in imported if n.startswith("jqat")], imported
  assert nvfp4.qat_matmul is qm.qat_matmul and "qat_matmul" in nvfp4.__all__


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_passes_build_for_sm90_with_16_byte_accesses():
  """Both passes compile for sm_90 on the CPU (Triton's bundled ptxas) as jax-triton specializes them, and load
  and store 16 bytes per instruction with no local memory: what lets them run at copy speed on the GPU."""
  import re

  gpu = plans.Target((9, 0))
  for plan in (plans.fake_quantize_rows(plans.Tensor.dense((8192, 4096), "bfloat16"), gpu),
               plans.fake_quantize_columns(plans.Tensor.dense((4096, 14336), "bfloat16"), gpu),
               plans.fake_quantize_columns(plans.Tensor.dense((4096, 4096), "float32"), gpu)):
    (launch,) = plan.launches
    args = tuple(jax.ShapeDtypeStruct(plan.buffers[a.name].shape, plan.buffers[a.name].dtype)
                 if isinstance(a, plans.Ref) else a for a in launch.args)
    outs = tuple(jax.ShapeDtypeStruct(plan.buffers[o].shape, plan.buffers[o].dtype) for o in launch.outputs)
    kernel = callback_launch.build(launch.kernel, callback_launch._arg_types(launch, args, outs),
                                   callback_launch._ones(launch), tuple(launch.constexprs.items()),
                                   launch.num_warps, launch.num_stages, (9, 0))
    ptx = kernel.asm["ptx"]
    loads, stores = re.findall(r"ld\.global\S*", ptx), re.findall(r"st\.global\S*", ptx)
    assert loads and all(".v4." in op for op in loads + stores), (launch.name, loads, stores)
    assert ".local" not in ptx and kernel.metadata.shared <= 4096, launch.name


def test_example_runs(capsys):
  """examples/pallas_qat_linear.py: the in-kernel quantize matches, and QAT training lowers the loss."""
  import runpy

  runpy.run_path(os.path.join(ROOT, "examples", "pallas_qat_linear.py"), run_name="__main__")
  out = capsys.readouterr().out
  assert "kernel quantize == nvfp4.quantize: True" in out
  first, last = (float(v) for v in out.split("QAT MLP loss: ")[1].split(" after")[0].split(" -> "))
  assert last < 0.5 * first


# ----------------------------------------------------------------------------- GPU: compiled, LLM-sized


def _specials(a, axis):
  """``a`` with NaN, +-Inf, -0 and a tie block (6s and s * the E2M1 boundaries) planted along ``axis``."""
  a = np.array(a)
  v = np.moveaxis(a, axis, -1)
  v[3, 5], v[4, 17], v[5, 33], v[6, :16] = np.nan, np.inf, -np.inf, -0.0
  v[7, :16] = np.float32([6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -.25, -.75, -1.25, -1.75, -2.5, -3.5, -5, 0]) / 8
  return a


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_passes_are_fake_quantize_gpu(dtype):
  """The compiled passes bit for bit against jqat.nvfp4.fake_quantize (XLA on the same GPU) at LLM sizes: x
  [2053, 4096] (a row tail), w [4096, 14336] (whole tiles), w [1024, 1000] (N neither a multiple of the tile nor of
  16); special values planted."""
  for axis, shape, seed in ((-1, (2053, 4096), 8), (0, (4096, 14336), 9), (0, (1024, 1000), 10)):
    a = jnp.asarray(_specials(scaled_normal(shape, dtype, axis, seed), axis))
    got = jax.jit(lambda a, axis=axis: jax_launch.fake_quantize(a, axis))(a)
    want = jax.jit(lambda a, axis=axis: nvfp4.fake_quantize(a, axis=axis).astype(jnp.bfloat16))(a)
    bits = lambda t: jax.lax.bitcast_convert_type(t, jnp.uint16)
    bad = int(jnp.sum(bits(got) != bits(want)))
    assert bad == 0, f"axis {axis}, {shape}, {np.dtype(dtype).name}: {bad} elements differ"


@pytest.mark.gpu
@pytest.mark.parametrize("x_dtype", DTYPES)
def test_compiled_product_against_float64_gpu(x_dtype):
  """qat_matmul (implementation None: the Triton passes and XLA's dot on the GPU) at (1000, 4096, 1024), against
  float64, NaN rows and columns included."""
  assert dispatch.triton_unavailable_reason() is None
  # FP16 outputs overflow past 65504: its x blocks stay at most 2**0 (sums of 4096 products within FP16's range).
  x = _specials(scaled_normal((1000, 4096), x_dtype, -1, 11, (-8, 0) if x_dtype == np.float16 else (-8, 4)), -1)
  w = _specials(scaled_normal((4096, 1024), BF16, 0, 12, (-10, 0)), 0)
  y = jax.jit(nvfp4.qat_matmul)(x, w)
  assert y.dtype == x_dtype
  assert_product(y, *exact_product(fq64(x, -1), fq64(w, 0), 1), 4096, f"y {np.dtype(x_dtype).name}")


@pytest.mark.gpu
def test_compiled_gradients_gpu():
  x = scaled_normal((4, 256, 512), BF16, -1, 13)
  w = scaled_normal((512, 384), BF16, 0, 14)
  dy = np.random.default_rng(15).standard_normal((4, 256, 384)).astype(BF16)
  loss = lambda x, w: jnp.sum(nvfp4.qat_matmul(x, w).astype(jnp.float32) * dy.astype(np.float32))
  dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
  d = dy.astype(np.float64)
  assert_product(dx, *exact_product(d, fq64(w, 0), ([2], [1])), 384, "dx")
  assert_product(dw, *exact_product(fq64(x, -1), d, ([0, 1], [0, 1])), 1024, "dw")
