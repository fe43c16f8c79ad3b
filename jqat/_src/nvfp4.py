"""NVFP4 fake quantization in pure JAX (docs/NUMERICS.md, section 2); public as :mod:`jqat.nvfp4`.

Blocks of 16 consecutive elements along one axis share an E4M3 scale; each
element becomes an E2M1 code. Every decision below is made by comparing the
input with exact products instead of dividing: XLA rewrites ``x / s`` into
``x * (1 / s)`` and ``amax / 6`` into ``amax * 0.16666667``, which moves exact
E2M1 midpoints (0.5859375 / 0.46875 must be 1.25 and round to 1.0). With ``s``
an E4M3 value, ``s * b`` is exact in FP32 for every E2M1 rounding boundary
``b``, and ``6 * m`` is exact for every E4M3 midpoint ``m``; a correctly
rounded quotient lands on such a boundary only when the input equals the
product, so the comparisons decide the same codes as IEEE division would.

Only elementwise ops, integer bit manipulation, reshapes that split or merge
an axis and max/sum reductions are used, with Python scalars as constants, so
the functions also work inside a user's ``pl.pallas_call`` kernel body: in
interpret mode, and compiled with the Pallas Triton backend on NVIDIA GPUs
(``compiler_params=plt.CompilerParams()``; ``x.shape[axis]`` a multiple of 16
there). The Mosaic GPU backend cannot express them (jax 0.10: its reductions
over one axis of a register array and its resource estimation of a
``custom_jvp`` raise ``NotImplementedError`` when the kernel is lowered).
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# Rounding boundaries between consecutive E2M1 magnitudes {0,.5,1,1.5,2,3,4,6},
# and the step each crossing adds. A tie goes to the even code (mantissa bit 0),
# i.e. up exactly at the odd-indexed boundaries 0.75, 1.75, 3.5.
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_STEPS = (0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0)
_E4M3_FINITE_CODES = 126  # positive finite codes 1..126 (2**-9 .. 448)


def _e4m3_value(code):
  """FP32 value of non-negative E4M3 code(s) in [0, 127] (int32 array; 127, the NaN code, gives 480)."""
  exp = code >> 3
  man = code & 7
  normal = lax.bitcast_convert_type(((exp + 120) << 23) | (man << 20), jnp.float32)
  subnormal = man.astype(jnp.float32) * 2.0**-9
  return jnp.where(exp == 0, subnormal, normal)


def _e4m3_code(amax):
  """E4M3 code (int32, 1..126) of ``e4m3(max(amax / 6, 2**-9))``; see :func:`e4m3_block_scale`."""
  amax = amax.astype(jnp.float32)
  count = jnp.zeros(amax.shape, jnp.int32)  # how many midpoints amax/6 is past
  for step in (64, 32, 16, 8, 4, 2, 1):
    cand = count + step
    c = jnp.minimum(cand, _E4M3_FINITE_CODES - 1)
    threshold = (_e4m3_value(c) + _e4m3_value(c + 1)) * 0.5 * 6.0  # exact
    past = (amax > threshold) | ((amax == threshold) & ((c & 1) == 1))
    count = jnp.where((cand < _E4M3_FINITE_CODES) & past, cand, count)
  return count + 1


def e4m3_block_scale(amax):
  """``e4m3(max(amax / 6, 2**-9))`` with RNE and saturation, for ``amax >= 0`` (FP32).

  A binary search over the E4M3 codes: code ``c + 1`` is chosen over ``c`` iff
  ``amax / 6`` is above the midpoint ``m`` of their values, decided exactly as
  ``amax > 6 * m`` (or equal, when ``c + 1`` has an even mantissa). Below the
  first midpoint the scale is the floor 2**-9; +Inf saturates to 448.
  """
  return _e4m3_value(_e4m3_code(amax))


def e2m1_code(x, scale):
  """Unsigned E2M1 code index (0..7) and magnitude of ``|x| / scale`` rounded RNE, saturating at 6.

  ``scale`` must be an E4M3 value (so ``scale * b`` is exact) broadcastable to ``x``.
  """
  ax = jnp.abs(x)
  code = jnp.zeros(x.shape, jnp.int32)
  mag = jnp.zeros(x.shape, jnp.float32)
  for i, (bound, step) in enumerate(zip(_E2M1_BOUNDS, _E2M1_STEPS)):
    edge = scale * bound
    up = (ax > edge) | ((ax == edge) if i % 2 else False)
    code = code + up.astype(jnp.int32)
    mag = mag + jnp.where(up, step, 0.0)
  return code, mag


# The blocks are split in place, [..., n, ...] -> [..., n // 16, 16, ...] with the
# reductions over the new axis ``axis + 1``: no transpose and no reshape that moves
# data across the fast axis, so a [BK, BN] tile quantized along its first axis stays
# a plain 3-D Triton tensor inside a Pallas kernel.
def _split(x, axis):
  return x.reshape(x.shape[:axis] + (x.shape[axis] // BLOCK, BLOCK) + x.shape[axis + 1 :])


def _merge(x, axis):
  return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2 :])


def _signed(magnitude, negative):
  """``magnitude`` (FP32, >= 0) with the sign bit set where ``negative``: -0 stays -0.

  Not ``where(negative, -m, m)``: the Pallas Triton lowering turns ``-m`` into ``0 - m``,
  which is +0 for m = 0 (seen on the H200: every negative value that quantizes to 0 came out +0).
  """
  sign = jnp.where(negative, jnp.int32(-(2**31)), jnp.int32(0))
  return lax.bitcast_convert_type(lax.bitcast_convert_type(magnitude, jnp.int32) | sign, jnp.float32)


def _scale_and_code(xb, valid, axis):
  """Per-block E4M3 code and NaN flag ``[..., nb, 1, ...]`` and the E2M1 code, magnitude and sign bit
  ``[..., nb, 16, ...]`` of blocked ``xb`` (blocks along ``axis + 1``); ``valid`` is None or bool like ``xb``."""
  x32 = xb.astype(jnp.float32)
  ax = jnp.abs(x32)
  nan = jnp.isnan(x32)
  if valid is not None:
    # Masked elements are ignored (not counted as 0): they must not raise the
    # NaN flag or set the amax of a block whose valid part is all smaller.
    ax = jnp.where(valid, ax, 0.0)
    nan = valid & nan
  amax = jnp.max(ax, axis=axis + 1, keepdims=True)
  # max over an int32 indicator, not jnp.any: Pallas' Triton lowering has no reduce_or.
  has_nan = jnp.max(nan.astype(jnp.int32), axis=axis + 1, keepdims=True) > 0
  scale_code = _e4m3_code(jnp.where(has_nan, 0.0, amax))
  code, mag = e2m1_code(x32, _e4m3_value(scale_code))
  negative = lax.bitcast_convert_type(x32, jnp.int32) < 0  # keeps -0 and negative NaN
  return scale_code, has_nan, code, mag, negative


def _fake_quantize(x, valid, axis):
  """The non-differentiable quantize-dequantize of already validated input (``valid``: None or bool like x)."""
  n = x.shape[axis]
  pad = -n % BLOCK
  if pad:  # a trailing partial block: padded here, excluded by the mask below
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    valid = jnp.pad(jnp.ones(x.shape, bool) if valid is None else valid, widths)
    x = jnp.pad(x, widths)
  xb = _split(x, axis)
  vb = None if valid is None else _split(valid, axis)
  scale_code, has_nan, _, mag, negative = _scale_and_code(xb, vb, axis)
  out = _signed(mag * _e4m3_value(scale_code), negative)  # exact: both factors have few bits
  out = jnp.where(has_nan, jnp.nan, out)
  if vb is not None:
    out = jnp.where(vb, out, 0.0)
  out = _merge(out, axis)
  if pad:
    out = lax.slice_in_dim(out, 0, n, axis=axis)
  return out.astype(x.dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _fake_quantize_ste(x, valid, axis):
  return _fake_quantize(x, valid, axis)


@_fake_quantize_ste.defjvp
def _fake_quantize_ste_jvp(axis, primals, tangents):
  x, valid = primals
  dx, _ = tangents
  dx = dx if valid is None else jnp.where(valid, dx, jnp.zeros_like(dx))
  return _fake_quantize(x, valid, axis), dx


def fake_quantize(x: jax.Array, axis: int = -1, mask: jax.Array | None = None) -> jax.Array:
  """NVFP4 quantize-dequantize ``x`` in blocks of 16 along ``axis`` (docs/NUMERICS.md, section 2).

  x: [...] float (bf16, fp16 or fp32); the result has the same shape and dtype
    (an empty ``x`` gives an empty result).
  mask: optional bool, broadcastable to ``x``; False positions are excluded from
    their block's amax and NaN check and come out as +0.
  A trailing partial block is quantized on its valid elements alone. A NaN in a
  block makes the whole block NaN; +-Inf saturates (scale 448, code +-6).

  Gradient: the straight-through estimator, ``d out / d x`` is the identity at
  valid positions and 0 at masked-out ones (a ``jax.custom_jvp``, so it composes
  with jit, vmap, grad and tracing inside a Triton-lowered Pallas kernel body).

  Inside a ``pl.pallas_call`` body (Triton lowering) ``x.shape[axis]`` must be a
  multiple of 16: the partial-block path pads, which that lowering cannot express.
  """
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"fake_quantize: x must be a floating array, got dtype {x.dtype}")
  axis = _normalize_axis(axis, x.ndim, "fake_quantize")
  valid = None
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
      raise TypeError(f"fake_quantize: mask must be a bool array, got dtype {mask.dtype}")
    try:
      valid = jnp.broadcast_to(mask, x.shape)
    except ValueError:
      raise ValueError(f"fake_quantize: mask must broadcast to x.shape {x.shape}, got shape {mask.shape}") from None
  return _fake_quantize_ste(x, valid, axis)


def quantize(x: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
  """Packs ``x`` as NVFP4: 4-bit E2M1 codes two per byte, one E4M3 scale per 16.

  x: [..., n, ...] float with ``n % 16 == 0`` along ``axis``.
  Returns ``codes: [..., n // 2, ...] uint8`` (element 2i in the low nibble,
  2i+1 in the high one; bit 3 sign, bits 2..1 exponent, bit 0 mantissa) and
  ``scales: [..., n // 16, ...] float8_e4m3fn`` (NaN for a block holding a NaN).
  Not differentiable (integer outputs). Also traces inside a Pallas kernel body.
  """
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"quantize: x must be a floating array, got dtype {x.dtype}")
  axis = _normalize_axis(axis, x.ndim, "quantize")
  n = x.shape[axis]
  if n % BLOCK:
    raise ValueError(f"quantize: x.shape[{axis}] must be a multiple of {BLOCK}, got {n}")
  scale_code, has_nan, code, _, negative = _scale_and_code(_split(x, axis), None, axis)
  nibble = _merge(code | jnp.where(negative, 8, 0), axis)
  pairs = x.shape[:axis] + (n // 2, 2) + x.shape[axis + 1 :]
  # Element 2i goes to the low nibble, 2i+1 to the high one: shift by 4 * parity and add.
  # A sum over the pair axis, not x[..., 0] | x[..., 1]: strided slices do not lower to Triton.
  shift = lax.broadcasted_iota(jnp.int32, pairs, axis + 1) * 4
  packed = jnp.sum(nibble.reshape(pairs) << shift, axis=axis + 1).astype(jnp.uint8)
  # The scale as its E4M3 bit pattern (0x7F is NaN): exact, with no float-to-fp8 conversion.
  scale_bits = jnp.where(has_nan, 0x7F, scale_code)
  scale_bits = scale_bits.reshape(scale_bits.shape[: axis + 1] + scale_bits.shape[axis + 2 :]).astype(jnp.uint8)
  return packed, lax.bitcast_convert_type(scale_bits, jnp.float8_e4m3fn)


def dequantize(codes: jax.Array, scales: jax.Array, axis: int = -1, dtype=jnp.bfloat16) -> jax.Array:
  """Inverse of :func:`quantize`: ``dequantize(*quantize(x)) == fake_quantize(x)`` bit for bit.

  codes: [..., n // 2, ...] uint8; scales: [..., n // 16, ...] float8_e4m3fn.
  Returns [..., n, ...] of ``dtype`` (a float dtype). Also traces inside a Pallas kernel body.
  """
  codes = jnp.asarray(codes)
  scales = jnp.asarray(scales)
  if codes.dtype != jnp.uint8:
    raise TypeError(f"dequantize: codes must be uint8, got {codes.dtype}")
  if scales.dtype != jnp.float8_e4m3fn:
    raise TypeError(f"dequantize: scales must be float8_e4m3fn, got {scales.dtype}")
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"dequantize: dtype must be a floating dtype, got {dtype}")
  axis = _normalize_axis(axis, codes.ndim, "dequantize")
  half = codes.shape[axis]
  expect = codes.shape[:axis] + (half * 2 // BLOCK,) + codes.shape[axis + 1 :]
  if half % (BLOCK // 2) or scales.shape != expect:
    raise ValueError(
        f"dequantize: scales must have shape {expect} for codes of shape {codes.shape}, got {scales.shape}"
    )
  out_shape = codes.shape[:axis] + (half * 2,) + codes.shape[axis + 1 :]
  # Each byte repeated for its two elements (broadcast + reshape, no gather), then the
  # element's nibble selected by its parity.
  pairs = codes.shape[:axis] + (half, 2) + codes.shape[axis + 1 :]
  byte = jnp.broadcast_to(jnp.expand_dims(codes.astype(jnp.int32), axis + 1), pairs).reshape(out_shape)
  nib = (byte >> ((lax.broadcasted_iota(jnp.int32, out_shape, axis) & 1) * 4)) & 15
  # E2M1 magnitude from its 3 bits: exponent e = code >> 1, mantissa m = code & 1.
  e = (nib & 7) >> 1
  m = (nib & 1).astype(jnp.float32)
  mag = jnp.where(e == 0, 0.5 * m, lax.bitcast_convert_type((e + 126) << 23, jnp.float32) * (1.0 + 0.5 * m))
  val = _signed(mag, (nib & 8) != 0)
  # The scale decoded from its bits (the same integer path as quantize; 0x7F is NaN).
  sbits = lax.bitcast_convert_type(scales, jnp.uint8).astype(jnp.int32)
  s = jnp.where((sbits & 127) == 127, jnp.nan, _e4m3_value(sbits & 127))
  s = _signed(s, (sbits & 128) != 0)
  blocks = codes.shape[:axis] + (expect[axis], BLOCK) + codes.shape[axis + 1 :]
  s = jnp.broadcast_to(jnp.expand_dims(s, axis + 1), blocks).reshape(out_shape)
  return (val * s).astype(dtype)


def _normalize_axis(axis: int, ndim: int, fn: str) -> int:
  # A bool is an int subclass (True would read as axis 1); None, "0" or 0.0 fail a comparison below with a raw error.
  if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
    raise TypeError(f"{fn}: axis must be an int, got {axis!r} ({type(axis).__name__})")
  axis = int(axis)
  if not -ndim <= axis < ndim:
    raise ValueError(f"{fn}: axis must be in [-{ndim}, {ndim}), got {axis}")
  return axis % ndim
