"""NVFP4 fake quantization in pure JAX (SPEC section 2).

Blocks of 16 consecutive elements along one axis share an E4M3 scale; each
element becomes an E2M1 code. Every decision below is made by comparing the
input with exact products instead of dividing: XLA rewrites ``x / s`` into
``x * (1 / s)`` and ``amax / 6`` into ``amax * 0.16666667``, which moves exact
E2M1 midpoints (0.5859375 / 0.46875 must be 1.25 and round to 1.0). With ``s``
an E4M3 value, ``s * b`` is exact in FP32 for every E2M1 rounding boundary
``b``, and ``6 * m`` is exact for every E4M3 midpoint ``m``; a correctly
rounded quotient lands on such a boundary only when the input equals the
product, so the comparisons decide the same codes as IEEE division would.

Only elementwise ops, integer bit manipulation and reductions are used, with
Python scalars as constants, so the functions also trace inside a user's
``pl.pallas_call`` kernel body.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["BLOCK", "fake_quantize", "quantize", "dequantize", "e2m1_code", "e4m3_block_scale"]

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
  """FP32 value of positive E4M3 code(s) in [1, 127) (int32 array)."""
  exp = code >> 3
  man = code & 7
  normal = lax.bitcast_convert_type(((exp + 120) << 23) | (man << 20), jnp.float32)
  subnormal = man.astype(jnp.float32) * 2.0**-9
  return jnp.where(exp == 0, subnormal, normal)


def e4m3_block_scale(amax):
  """``e4m3(max(amax / 6, 2**-9))`` with RNE and saturation, for ``amax >= 0`` (FP32).

  A binary search over the E4M3 codes: code ``c + 1`` is chosen over ``c`` iff
  ``amax / 6`` is above the midpoint ``m`` of their values, decided exactly as
  ``amax > 6 * m`` (or equal, when ``c + 1`` has an even mantissa). Below the
  first midpoint the scale is the floor 2**-9; +Inf saturates to 448.
  """
  amax = amax.astype(jnp.float32)
  count = jnp.zeros(amax.shape, jnp.int32)  # how many midpoints amax/6 is past
  for step in (64, 32, 16, 8, 4, 2, 1):
    cand = count + step
    c = jnp.minimum(cand, _E4M3_FINITE_CODES - 1)
    threshold = (_e4m3_value(c) + _e4m3_value(c + 1)) * 0.5 * 6.0  # exact
    past = (amax > threshold) | ((amax == threshold) & ((c & 1) == 1))
    count = jnp.where((cand < _E4M3_FINITE_CODES) & past, cand, count)
  return _e4m3_value(count + 1)


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


def _blocked(x, axis, mask):
  """Moves ``axis`` last, pads it to a multiple of 16 and splits it into blocks."""
  valid = jnp.ones(x.shape, bool) if mask is None else jnp.broadcast_to(mask, x.shape)
  x = jnp.moveaxis(x, axis, -1)
  valid = jnp.moveaxis(valid, axis, -1)
  n = x.shape[-1]
  pad = -n % BLOCK
  if pad:
    widths = [(0, 0)] * (x.ndim - 1) + [(0, pad)]
    x = jnp.pad(x, widths)
    valid = jnp.pad(valid, widths)
  shape = x.shape[:-1] + (x.shape[-1] // BLOCK, BLOCK)
  return x.reshape(shape), valid.reshape(shape), n


def _unblocked(y, axis, n):
  y = y.reshape(y.shape[:-2] + (-1,))[..., :n]
  return jnp.moveaxis(y, -1, axis)


def _scale_and_code(xb, valid):
  """Per-block scale and signed E2M1 magnitudes for blocked FP32 ``xb [..., nb, 16]``."""
  x32 = xb.astype(jnp.float32)
  # Masked elements are ignored (not counted as 0): they must not lower the
  # NaN check or set the amax of a block whose valid part is all smaller.
  amax = jnp.max(jnp.where(valid, jnp.abs(x32), 0.0), axis=-1, keepdims=True)
  has_nan = jnp.any(valid & jnp.isnan(x32), axis=-1, keepdims=True)
  scale = e4m3_block_scale(jnp.where(has_nan, 0.0, amax))
  code, mag = e2m1_code(x32, scale)
  negative = lax.bitcast_convert_type(x32, jnp.int32) < 0  # keeps -0 and negative NaN
  return scale, has_nan, code, mag, negative


def fake_quantize(x: jax.Array, axis: int = -1, mask: jax.Array | None = None) -> jax.Array:
  """NVFP4 quantize-dequantize ``x`` in blocks of 16 along ``axis`` (SPEC section 2).

  x: [...] float (bf16, fp16 or fp32); the result has the same shape and dtype.
  mask: optional bool, broadcastable to ``x``; False positions are excluded from
    their block's amax and NaN check and come out as +0.
  A trailing partial block is quantized on its valid elements alone. A NaN in a
  block makes the whole block NaN; +-Inf saturates (scale 448, code +-6).
  """
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"fake_quantize: x must be a floating array, got dtype {x.dtype}")
  axis = _normalize_axis(axis, x.ndim, "fake_quantize")
  xb, valid, n = _blocked(x, axis, mask)
  scale, has_nan, _, mag, negative = _scale_and_code(xb, valid)
  out = jnp.where(negative, -mag, mag) * scale  # exact: both factors have few bits
  out = jnp.where(has_nan, jnp.nan, out)
  out = jnp.where(valid, out, 0.0)
  return _unblocked(out, axis, n).astype(x.dtype)


def quantize(x: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
  """Packs ``x`` as NVFP4: 4-bit E2M1 codes two per byte, one E4M3 scale per 16.

  x: [..., n, ...] float with ``n % 16 == 0`` along ``axis``.
  Returns ``codes: [..., n // 2, ...] uint8`` (element 2i in the low nibble,
  2i+1 in the high one; bit 3 sign, bits 2..1 exponent, bit 0 mantissa) and
  ``scales: [..., n // 16, ...] float8_e4m3fn`` (NaN for a block holding a NaN).
  """
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"quantize: x must be a floating array, got dtype {x.dtype}")
  axis = _normalize_axis(axis, x.ndim, "quantize")
  if x.shape[axis] % BLOCK:
    raise ValueError(f"quantize: x.shape[{axis}] must be a multiple of {BLOCK}, got {x.shape[axis]}")
  xb, valid, n = _blocked(x, axis, None)
  scale, has_nan, code, _, negative = _scale_and_code(xb, valid)
  nibble = (code | jnp.where(negative, 8, 0)).astype(jnp.uint8)
  nibble = nibble.reshape(nibble.shape[:-2] + (n // 2, 2))
  packed = nibble[..., 0] | (nibble[..., 1] << 4)
  scale = jnp.where(has_nan, jnp.nan, scale)[..., 0].astype(jnp.float8_e4m3fn)
  return jnp.moveaxis(packed, -1, axis), jnp.moveaxis(scale, -1, axis)


def dequantize(codes: jax.Array, scales: jax.Array, axis: int = -1, dtype=jnp.bfloat16) -> jax.Array:
  """Inverse of :func:`quantize`: ``dequantize(*quantize(x)) == fake_quantize(x)`` bit for bit.

  codes: [..., n // 2, ...] uint8; scales: [..., n // 16, ...] float8_e4m3fn.
  Returns [..., n, ...] of ``dtype``.
  """
  codes = jnp.asarray(codes)
  scales = jnp.asarray(scales)
  if codes.dtype != jnp.uint8:
    raise TypeError(f"dequantize: codes must be uint8, got {codes.dtype}")
  if scales.dtype != jnp.float8_e4m3fn:
    raise TypeError(f"dequantize: scales must be float8_e4m3fn, got {scales.dtype}")
  axis = _normalize_axis(axis, codes.ndim, "dequantize")
  expect = codes.shape[:axis] + (codes.shape[axis] * 2 // BLOCK,) + codes.shape[axis + 1 :]
  if codes.shape[axis] % (BLOCK // 2) or scales.shape != expect:
    raise ValueError(f"dequantize: scales must have shape {expect} for codes of shape {codes.shape}, got {scales.shape}")
  c = jnp.moveaxis(codes, axis, -1)
  nib = jnp.stack([c & 15, c >> 4], axis=-1).reshape(c.shape[:-1] + (-1,)).astype(jnp.int32)
  mag_code = nib & 7
  # E2M1 magnitude from its 3 bits: exponent e = code >> 1, mantissa m = code & 1.
  e = mag_code >> 1
  m = (mag_code & 1).astype(jnp.float32)
  mag = jnp.where(e == 0, 0.5 * m, lax.bitcast_convert_type((e + 126) << 23, jnp.float32) * (1.0 + 0.5 * m))
  val = jnp.where((nib & 8) != 0, -mag, mag)
  s = jnp.repeat(jnp.moveaxis(scales, axis, -1).astype(jnp.float32), BLOCK, axis=-1)
  return jnp.moveaxis(val * s, -1, axis).astype(dtype)


def _normalize_axis(axis: int, ndim: int, fn: str) -> int:
  if not -ndim <= axis < ndim:
    raise ValueError(f"{fn}: axis must be in [-{ndim}, {ndim}), got {axis}")
  return axis % ndim
