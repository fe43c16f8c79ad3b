"""The NVFP4 quantizer against the independent NumPy oracle, bit for bit: the pure-JAX ``jqat.nvfp4`` and, on the
shared quantizer cases (tests/cases.py), the Triton ``fake_quantize_kernel`` (interpreter on the CPU, compiled on a
GPU with the hardware and the software E4M3 / E2M1 paths)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from cases import FQ_CASES, fake_quantize, implementations
from conftest import HAS_GPU
from jax.experimental import pallas as pl
from oracle import E2M1_VALUES, E4M3_VALUES, bits, fq_oracle

from jqat import nvfp4

fq = jax.jit(nvfp4.fake_quantize, static_argnames="axis")
SCALES = E4M3_VALUES[1:].astype(np.float32)  # the 126 positive finite E4M3 values
BOUNDS = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def assert_bitwise(actual, expected):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.dtype == expected.dtype and actual.shape == expected.shape
  bad = bits(actual) != bits(expected)
  assert not bad.any(), f"{bad.sum()} mismatches, first at {np.argwhere(bad)[:3].tolist()}"


def _fq_case(name):
  make, dtype = FQ_CASES[name]
  x = make()
  return np.asarray(x.astype(getattr(ml_dtypes, dtype, dtype)), np.float32), dtype


def _assert_case(implementation, name, flags=None):
  x, dtype = _fq_case(name)
  got = fake_quantize(implementation, x, dtype, flags)
  want = fq_oracle(x).astype(getattr(ml_dtypes, dtype, dtype)).astype(np.float32)  # exact in bf16 / fp16
  bad = np.nonzero(bits(got) != bits(want))
  assert bad[0].size == 0, f"{bad[0].size} mismatches, first at {tuple(i[0] for i in bad)}: " \
      f"x={x[tuple(i[0] for i in bad)]} got={got[tuple(i[0] for i in bad)]} want={want[tuple(i[0] for i in bad)]}"


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the interpreter's max over a NaN block
@pytest.mark.parametrize("implementation", implementations("xla", "interpreter", "triton"))
@pytest.mark.parametrize("name", sorted(FQ_CASES))
def test_fake_quantize_matches_oracle(implementation, name):
  """Every bf16 pattern (in runs and shuffled), every E2M1 boundary under every E4M3 scale, zero / NaN / Inf / huge
  blocks in each dtype, tails of partial blocks: bit for bit."""
  _assert_case(implementation, name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(FQ_CASES))
def test_fake_quantize_kernel_software_path_gpu(name):
  """The compiled kernel with the software E4M3 / E2M1 paths (the pre-Blackwell, pre-Hopper code)."""
  from jqat.kernels_triton import nvfp4 as knv

  assert HAS_GPU
  _assert_case("triton", name, knv.quant_flags(None))


def test_every_bf16_pattern_under_every_scale():
  """All 65,536 BF16 patterns, sorted into blocks of similar magnitude, each block also run
  with a leading element 6*s for every E4M3 scale s, so each value is divided by every scale
  that can apply to it and lands on (or next to) every E2M1 rounding boundary."""
  pats = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
  order = np.argsort(np.abs(pats.astype(np.float32)), kind="stable")  # NaNs last
  groups = pats[order]
  groups = np.concatenate([groups, np.zeros(-len(groups) % 15, groups.dtype)]).reshape(-1, 15)
  lead = (6 * SCALES).astype(ml_dtypes.bfloat16)  # 6*s is exact in bf16 (<= 7 significant bits)
  x = np.concatenate([np.broadcast_to(lead[None, :, None], (len(groups), len(lead), 1)),
                      np.broadcast_to(groups[:, None, :], (len(groups), len(lead), 15))], axis=-1)
  x = np.ascontiguousarray(x.reshape(-1, 16))
  assert_bitwise(fq(x), fq_oracle(x).astype(ml_dtypes.bfloat16))


def test_exact_e2m1_midpoints_and_neighbours():
  # For each scale s and boundary b: x = s*b exactly (a tie), and the FP32 neighbours of it.
  s = SCALES[:, None]
  ties = (s * BOUNDS[None, :]).astype(np.float32)
  x = np.stack([ties, np.nextafter(ties, 0), np.nextafter(ties, np.inf)], -1).reshape(len(SCALES), -1)
  x = np.concatenate([x, -x], axis=-1)  # 42 values per scale
  x = np.pad(x, ((0, 0), (0, -x.shape[1] % 15)))
  blocks = x.reshape(len(SCALES), -1, 15)
  lead = np.broadcast_to((6 * s)[:, None, :], blocks.shape[:2] + (1,))
  xb = np.concatenate([lead, blocks], -1).reshape(-1, 16).astype(np.float32)
  assert_bitwise(fq(xb), fq_oracle(xb))
  # The worked example of docs/NUMERICS.md, section 2.1: 0.5859375 / 0.46875 is exactly 1.25 and rounds to 1.0.
  one = np.zeros(16, np.float32)
  one[:2] = [0.5859375, 0.46875 * 6]
  assert fq(one)[0] == np.float32(0.46875)


def test_exact_e4m3_scale_midpoints():
  # amax = 6*m for every midpoint m between consecutive E4M3 values, and its FP32 neighbours.
  mids = ((E4M3_VALUES[1:-1] + E4M3_VALUES[2:]) / 2).astype(np.float32)
  amax = np.concatenate([6 * mids, np.nextafter(6 * mids, 0), np.nextafter(6 * mids, np.inf)]).astype(np.float32)
  x = np.zeros((len(amax), 16), np.float32)
  x[:, 0] = amax
  x[:, 1] = -amax / 3
  x[:, 2:] = np.linspace(-1, 1, 14)[None] * amax[:, None]
  assert_bitwise(fq(x), fq_oracle(x))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("magnitude", [1e-30, 1e-6, 1e-3, 1.0, 300.0, 1e4, 1e30])
def test_random_inputs(dtype, magnitude):
  if dtype == np.float16 and magnitude > 6e4:
    pytest.skip("fp16 overflows")
  rng = np.random.default_rng(7)
  x = (rng.standard_normal((48, 80)) * np.float32(magnitude)).astype(dtype)
  assert_bitwise(fq(x), fq_oracle(x).astype(dtype))


def test_zero_blocks_keep_floor_scale_and_sign():
  x = np.zeros((3, 16), np.float32)
  x[1] = -0.0
  x[2, ::2] = -0.0
  x[2, 1] = 2.0**-11  # below half the floor scale: rounds to a signed zero
  x[2, 3] = -(2.0**-11)
  x[2, 5] = 2.0**-9 * 0.75  # a tie between codes 1 and 2 at the floor scale 2**-9 -> 1.0*2**-9
  out = np.asarray(fq(x))
  assert_bitwise(out, fq_oracle(x))
  assert np.signbit(out[1]).all() and np.signbit(out[2, 3]) and not np.signbit(out[2, 1])
  assert out[2, 5] == np.float32(2.0**-9)


def test_saturation_past_2688():
  x = np.float32([[3000.0, 2688.0, 2700.0, -1e30, 500.0] + [0.0] * 11])
  out = np.asarray(fq(x))
  assert_bitwise(out, fq_oracle(x))
  assert out[0, 0] == 2688 and out[0, 3] == -2688  # scale 448, code 6


def test_nan_poisons_the_block_and_inf_saturates():
  x = np.ones((3, 32), np.float32)
  x[0, 5] = np.nan
  x[1, 20] = np.inf
  x[2, 3] = -np.inf
  out = np.asarray(fq(x))
  assert np.isnan(out[0, :16]).all() and np.isfinite(out[0, 16:]).all()
  assert out[1, 20] == 2688 and out[2, 3] == -2688
  assert_bitwise(out, fq_oracle(x))


def test_masked_positions_are_excluded():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, 48)).astype(np.float32)
  mask = rng.random((8, 48)) < 0.6
  x[~mask] *= 1000  # a masked huge value must not set the scale
  x[0, np.flatnonzero(~mask[0])[0]] = np.nan  # a masked NaN must not poison
  out = np.asarray(jax.jit(nvfp4.fake_quantize)(x, mask=mask))
  assert_bitwise(out, fq_oracle(x, mask=mask))
  assert (bits(out[~mask]) == 0).all()  # +0 where masked
  assert np.isfinite(out[0]).all()


def test_partial_tail_block_and_other_axis():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((20, 5, 3)).astype(np.float32)
  assert_bitwise(jax.jit(nvfp4.fake_quantize, static_argnames="axis")(x, axis=0), fq_oracle(x, axis=0))


def test_quantize_packs_codes_and_dequantize_inverts_bitwise():
  rng = np.random.default_rng(3)
  x = (rng.standard_normal((4, 64)) * 3).astype(ml_dtypes.bfloat16)
  x[0, :16] = np.nan
  x[1, 1] = -0.0
  codes, scales = jax.jit(nvfp4.quantize)(x)
  assert codes.dtype == jnp.uint8 and codes.shape == (4, 32)
  assert scales.dtype == jnp.float8_e4m3fn and scales.shape == (4, 4)
  assert_bitwise(nvfp4.dequantize(codes, scales), fq_oracle(x).astype(ml_dtypes.bfloat16))
  # Layout: element 2i in the low nibble, sign in bit 3; code 0b1010 is -1.0.
  ref = fq_oracle(x)
  c = np.asarray(codes)
  s = np.asarray(scales).astype(np.float32).repeat(16, axis=1)
  low = c & 15
  mag = E2M1_VALUES[low & 7] * np.where(low & 8, -1, 1)
  np.testing.assert_array_equal((mag * s[:, ::2])[1:], ref[1:, ::2])
  np.testing.assert_array_equal(np.asarray(codes)[1, 0] >> 4, 0b1000)  # -0 keeps its sign bit


def test_quantize_rejects_bad_input():
  with pytest.raises(ValueError, match="x.shape"):
    nvfp4.quantize(jnp.ones((3, 20)))
  with pytest.raises(TypeError, match="x must be a floating"):
    nvfp4.fake_quantize(jnp.ones((16,), jnp.int32))
  with pytest.raises(ValueError, match="axis"):
    nvfp4.fake_quantize(jnp.ones((16,)), axis=2)
  with pytest.raises(ValueError, match="scales must have shape"):
    nvfp4.dequantize(jnp.zeros((4, 8), jnp.uint8), jnp.zeros((4, 2), jnp.float8_e4m3fn))


def test_inside_a_pallas_kernel_body():
  """The quantizer traces inside a user's pallas_call body (interpret mode on CPU)."""
  rng = np.random.default_rng(4)
  x = (rng.standard_normal((16, 64)) * 2).astype(np.float32)
  x[3, 7] = 0.5859375
  x[3, 8] = 0.46875 * 6

  def kernel(x_ref, o_ref):
    o_ref[...] = nvfp4.fake_quantize(x_ref[...], axis=-1)

  out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)
  assert_bitwise(out, fq_oracle(x))


@pytest.mark.parametrize("shape, axis", [((0,), -1), ((3, 0), -1), ((0, 32), -1), ((0, 32), 0), ((4, 0, 16), 2)])
def test_empty_arrays(shape, axis):
  x = jnp.zeros(shape, jnp.bfloat16)
  y = nvfp4.fake_quantize(x, axis=axis)
  assert y.shape == shape and y.dtype == x.dtype
  assert nvfp4.fake_quantize(x, axis=axis, mask=jnp.zeros(shape, bool)).shape == shape
  codes, scales = nvfp4.quantize(x, axis=axis)
  n = shape[axis]
  assert codes.shape == shape[: axis % len(shape)] + (n // 2,) + shape[axis % len(shape) + 1 :]
  assert scales.shape == shape[: axis % len(shape)] + (n // 16,) + shape[axis % len(shape) + 1 :]
  assert codes.dtype == jnp.uint8 and scales.dtype == jnp.float8_e4m3fn
  back = nvfp4.dequantize(codes, scales, axis=axis, dtype=jnp.float16)
  assert back.shape == shape and back.dtype == jnp.float16


def test_gradient_is_the_straight_through_estimator():
  """d fq(x) / dx is the identity at valid positions and 0 at masked ones (the old code gave 0)."""
  rng = np.random.default_rng(6)
  x = rng.standard_normal((4, 40)).astype(np.float32)
  w = rng.standard_normal((4, 40)).astype(np.float32)
  mask = rng.random((4, 40)) < 0.7
  g = jax.jit(jax.grad(lambda x: jnp.sum(w * nvfp4.fake_quantize(x))))(x)
  np.testing.assert_array_equal(g, w)
  g = jax.jit(jax.grad(lambda x: jnp.sum(w * nvfp4.fake_quantize(x, mask=mask))))(x)
  np.testing.assert_array_equal(g, np.where(mask, w, 0))
  # A broadcast mask, bf16, another axis, and under vmap.
  xb = x.astype(ml_dtypes.bfloat16)
  col = mask[:, :1]
  g = jax.grad(lambda x: jnp.sum(nvfp4.fake_quantize(x, axis=0, mask=col).astype(jnp.float32)))(xb)
  assert g.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(g, np.float32), np.broadcast_to(col, x.shape).astype(np.float32))
  g = jax.vmap(jax.grad(lambda r: jnp.sum(nvfp4.fake_quantize(r) * 3.0)))(x)
  np.testing.assert_array_equal(g, np.full(x.shape, 3.0, np.float32))


def test_forward_values_unchanged_under_differentiation():
  rng = np.random.default_rng(8)
  x = (rng.standard_normal((8, 48)) * 5).astype(np.float32)
  y, _ = jax.vjp(nvfp4.fake_quantize, x)
  assert_bitwise(y, fq_oracle(x))
  y, dy = jax.jvp(nvfp4.fake_quantize, (x,), (np.ones_like(x),))
  assert_bitwise(y, fq_oracle(x))
  np.testing.assert_array_equal(dy, np.ones_like(x))


def test_mask_validation():
  with pytest.raises(TypeError, match="mask must be a bool"):
    nvfp4.fake_quantize(jnp.ones((16,)), mask=jnp.ones((16,)))
  with pytest.raises(ValueError, match="mask must broadcast"):
    nvfp4.fake_quantize(jnp.ones((2, 16)), mask=jnp.ones((3, 16), bool))
  with pytest.raises(TypeError, match="dtype must be a floating"):
    nvfp4.dequantize(jnp.zeros((4, 8), jnp.uint8), jnp.zeros((4, 1), jnp.float8_e4m3fn), dtype=jnp.int32)
