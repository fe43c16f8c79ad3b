"""Pure-JAX tail RoPE + microscaled QDQ (SPEC section 4): the oracle of the kernel and the "xla" implementation.

Two things XLA does by itself would break bit-exactness, so neither is relied on:
- It may or may not contract ``a * b + c`` into an FMA. The RoPE FMA is
  therefore computed explicitly: the FP32 cache value is split into 16 + 8
  significant bits, so both partial products with the 8-bit BF16 operand are
  exact (and contraction of an exact product changes nothing); the three exact
  terms are summed with a single rounding by the TwoSum / round-to-odd
  algorithm of Boldo and Melquiond ("Emulation of FMA and correctly rounded
  sums", IEEE TC 2008). The separately rounded ``b * sin`` of the spec is also
  formed from the two exact partial products, so it cannot be fused either.
- Signed zeros never depend on operation structure: XLA (and the LLVM
  back ends below it) may rewrite negations, subtractions and selects between
  float constants ``-0.0``/``+0.0`` in ways that change only the sign of a
  zero, so every sign that IEEE fixes for a zero result is computed from the
  operands' bits with integer logic (product: xor of the signs; exact-zero
  sum: -0 only when both addends are -0) and forced onto the result's bits.
  Negation is a sign-bit flip. A nonzero result carries its sign in its value.
- XLA:CPU flushes subnormal FP32 results and inputs of arithmetic to zero. The
  fp4/UE8M0 floor (``6 * 2**-126``) puts scales at ``2**-126`` and outputs at
  ``2**-127``, so the quantizer compares and builds values as integer bit
  patterns, never doing float arithmetic below ``2**-126``. RoPE pairs below
  ``2**-40`` are scaled by ``2**64`` (exactly, through the bits) for the FMA.
  What remains: a RoPE intermediate whose exact FP32 value is subnormal (inputs
  or products below ``2**-126``) follows the platform's flush.

Quantization is division-free like :mod:`jqat.nvfp4`: with a power-of-two or
E4M3 scale ``s`` every ``s * boundary`` is exact, so comparing ``|x|`` with it
decides the same code as the correctly rounded quotient.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jqat import nvfp4

ROPE_CHANNELS = 64  # the rotated tail: 32 adjacent pairs


@dataclasses.dataclass(frozen=True)
class Mode:
  """One row of the SPEC section 4 table."""
  width: int          # channels per row (x.shape[-1])
  group: int          # channels per scale group
  fp8: bool           # E4M3 elements (limit 448) instead of E2M1 (limit 6)
  e4m3_scale: bool    # E4M3 group scale instead of UE8M0
  floor: float        # amax floor, applied before the scale
  per_token: bool     # [N, H, width] with one position per token shared by its H heads


MODES = {
    ("fp4", 32, "ue8m0"): Mode(128, 32, False, False, 6.0 * 2.0**-126, True),
    ("fp8", 32, "ue8m0"): Mode(512, 32, True, False, 1e-4, False),
    ("fp4", 16, "e4m3"): Mode(512, 16, False, True, 6.0 * 2.0**-9, False),
}

# Bit patterns of the E2M1 magnitudes and of the rounding boundaries between them.
_E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # a tie at index i goes up iff i is odd
# E4M3 (fn) magnitudes by code 0..126 and the midpoints between consecutive codes.
_E4M3_VALUES = np.array([m * 2.0**-9 for m in range(8)]
                        + [(1 + m / 8) * 2.0**(e - 7) for e in range(1, 16) for m in range(8)][:119], np.float32)
_E4M3_MIDS = ((_E4M3_VALUES[:-1].astype(np.float64) + _E4M3_VALUES[1:]) / 2).astype(np.float32)


_SIGN = np.int32(-2**31)
_MAGNITUDE = np.int32(2**31 - 1)


def _bits(x):
  return lax.bitcast_convert_type(x, jnp.int32)


def _float(bits):
  return lax.bitcast_convert_type(bits, jnp.float32)


def _sign_bits(x):
  """The sign bit of FP32 ``x`` as an int32 (0 or -2**31): integer logic, immune to float rewrites."""
  return _bits(x) & _SIGN


def _with_sign(v, sign_bits):
  """``|v|`` with the sign bit ``sign_bits`` (0 or -2**31), on the bits."""
  return _float((_bits(v) & _MAGNITUDE) | sign_bits)


def _negate(v):
  """``-v`` as a sign-bit flip: exact for zeros too, whatever XLA makes of a float negation."""
  return _float(_bits(v) ^ _SIGN)


def _const_bits(values):
  return np.asarray(values, np.float32).view(np.int32)


def _times_pow2_bits(value_bits, k):
  """FP32 bits of ``value * 2**k`` for positive normal ``value`` (given by its bits) and int32 ``k``.

  Built from the exponent field, so a subnormal result is produced exactly
  (rather than flushed) as long as the shift drops no set bit, which holds for
  the few-bit E2M1/E4M3 values and boundaries used here.
  """
  biased = (value_bits >> 23) + k
  frac = value_bits & 0x7FFFFF
  subnormal = (frac | 0x800000) >> jnp.clip(1 - biased, 0, 31)
  return jnp.where(biased >= 1, (biased << 23) | frac, subnormal)


# ----------------------------------------------------------------------------- RoPE


def _two_sum(x, y):
  """``s + err == x + y`` exactly, ``s = fl(x + y)`` (Knuth's TwoSum; no multiplies, so nothing to contract)."""
  s = x + y
  bb = s - x
  return s, (x - (s - bb)) + (y - bb)


def _add_round_to_odd(x, y):
  """``x + y`` rounded to odd: when inexact, the neighbour whose last mantissa bit is 1."""
  s, err = _two_sum(x, y)
  bits = _bits(s)
  away = (err > 0) == (s > 0)  # exact value is farther from zero than s
  fix = (err != 0) & ((bits & 1) == 0)
  return jnp.where(fix, _float(bits + jnp.where(away, np.int32(1), np.int32(-1))), s)


def _split16(c):
  """``c == hi + lo`` with ``hi`` the top 16 significant bits: a BF16 times either part is exact in FP32."""
  hi = _float(_bits(c) & -256)
  return hi, c - hi


def _exact_product_terms(a, c):
  """Two FP32 numbers summing exactly to ``a * c`` for BF16-valued ``a`` (8 significant bits)."""
  c_hi, c_lo = _split16(c)
  return a * c_hi, a * c_lo


def _fma(a, c, d):
  """``fma(a, c, d)`` in FP32 with a single rounding, for BF16-valued ``a``; exact while nothing underflows."""
  p1, p2 = _exact_product_terms(a, c)
  uh, ul = _two_sum(p1, d)
  th, tl = _two_sum(p2, uh)
  z = th + _add_round_to_odd(tl, ul)
  # An exactly zero result is +0 in round-to-nearest unless the exact product a * c and d
  # are both -0 (IEEE 754 6.3). The float path cannot be trusted with that sign (the split
  # may sign p2's zero differently from a * c, and XLA may rewrite the adds, negations or
  # selects between zero constants), so it is decided on the bits and set on the bits.
  prod_negative_zero = ((a == 0) | (c == 0)) & (((_bits(a) ^ _bits(c)) & _SIGN) != 0)
  negative_zero = prod_negative_zero & (d == 0) & (_sign_bits(d) != 0)
  zero_bits = jnp.where(negative_zero, _SIGN, np.int32(0))
  return _float(jnp.where(z == 0, zero_bits, _bits(z)))


def _round_product(a, c):
  """``fl(a * c)`` (one FP32 rounding) from the exact partial products, so no FMA can absorb it.

  The sign of a product is the xor of the operands' signs, zero or not; it is set on the
  bits because the sum of the partial products may sign a zero differently.
  """
  p1, p2 = _exact_product_terms(a, c)
  return _with_sign(p1 + p2, (_bits(a) ^ _bits(c)) & _SIGN)


_TINY = 2.0**-40
_UP = 64


def _scale_up_bf16(v):
  """``v * 2**64`` exactly for BF16-valued FP32 ``v`` with ``|v| < 2**-40``, subnormal ``v`` included."""
  bits = _bits(v)
  normal = _float(bits + (_UP << 23))
  frac = (bits & 0x7FFFFF).astype(jnp.float32) * 2.0**(_UP - 149)  # v = frac * 2**-149 when subnormal
  subnormal = _float(_bits(frac) | (bits & _SIGN))  # frac >= 0: set v's sign on the bits
  return jnp.where((bits & 0x7F800000) == 0, subnormal, normal)


def rope(a, b, cos, sin):
  """The rotated pair ``(bf16(fma(a, cos, -(b*sin))), bf16(fma(b, cos, a*sin)))`` as FP32 arrays.

  a, b: [...] FP32 holding BF16 values; cos, sin: [...] FP32.
  """
  # Pairs that are both tiny are rotated at 2**64 their size, so that products and
  # error terms stay normal; the results scale back exactly when they are normal.
  tiny = jnp.maximum(jnp.abs(a), jnp.abs(b)) < _TINY
  a = jnp.where(tiny, _scale_up_bf16(a), a)
  b = jnp.where(tiny, _scale_up_bf16(b), b)
  real = _fma(a, cos, _negate(_round_product(b, sin)))
  imag = _fma(b, cos, _round_product(a, sin))
  back = jnp.where(tiny, 2.0**-_UP, 1.0).astype(jnp.float32)
  # Scaling back and rounding to BF16 keep the sign (also when they underflow to zero), so
  # the sign bit of the FMA result, decided above, is set again on the bits.
  return tuple(_with_sign((v * back).astype(jnp.bfloat16).astype(jnp.float32), _sign_bits(v)) for v in (real, imag))


# ------------------------------------------------------------------------ quantization


def _ue8m0_exponent(amax, limit):
  """k with ``2**k = 2**ceil(log2(fp32(amax * fp32(1 / limit))))``, for normal ``amax`` (after the floor)."""
  tb = _bits(amax * np.float32(1.0 / limit))  # one FP32 rounding, as specified
  return ((tb >> 23) & 0xFF) - 127 + ((tb & 0x7FFFFF) != 0).astype(jnp.int32)


def _e2m1_pow2(ax_bits, k):
  """Bits of ``e2m1(|x| / 2**k) * 2**k`` (RNE, saturating), compared and built as integers."""
  code = jnp.zeros(ax_bits.shape, jnp.int32)
  for i, bound in enumerate(_const_bits(_E2M1_BOUNDS)):
    edge = _times_pow2_bits(jnp.int32(bound), k)
    code = code + ((ax_bits > edge) | ((ax_bits == edge) & (i % 2 == 1))).astype(jnp.int32)
  out = _times_pow2_bits(jnp.asarray(_const_bits(_E2M1_VALUES))[code], k)
  return jnp.where(code == 0, 0, out)


def _e4m3_pow2(ax_bits, k):
  """Bits of ``e4m3(min(|x| / 2**k, 448)) * 2**k`` (RNE), by binary search over the 126 midpoints."""
  mids = jnp.asarray(_const_bits(_E4M3_MIDS))
  count = jnp.zeros(ax_bits.shape, jnp.int32)  # midpoints passed = the code
  for step in (64, 32, 16, 8, 4, 2, 1):
    cand = count + step
    j = jnp.minimum(cand, len(_E4M3_MIDS)) - 1  # midpoint between codes j and j + 1
    edge = _times_pow2_bits(mids[j], k)
    past = (ax_bits > edge) | ((ax_bits == edge) & ((j & 1) == 1))  # a tie goes to the even code
    count = jnp.where((cand <= len(_E4M3_MIDS)) & past, cand, count)
  out = _times_pow2_bits(jnp.asarray(_const_bits(_E4M3_VALUES))[count], k)
  return jnp.where(count == 0, 0, out)


def qdq(v, mode: Mode):
  """Quantize/dequantize FP32 ``v: [..., width]`` (BF16 values) in groups; returns bf16 ``[..., width]``."""
  vg = v.reshape(v.shape[:-1] + (-1, mode.group))
  bits = _bits(vg)
  ax_bits = bits & 0x7FFFFFFF
  sign = bits & np.int32(-2**31)
  # Subnormal inputs may read as 0 in this max (XLA:CPU); the floor is above them anyway.
  amax = jnp.max(jnp.abs(vg), axis=-1, keepdims=True)
  if mode.e4m3_scale:
    # nvfp4's E4M3 scale is e4m3(max(amax / 6, 2**-9)): the same value as with the floor
    # 6 * 2**-9 applied first, since fl(amax / 6) >= 2**-9 iff amax >= 6 * 2**-9.
    scale = nvfp4.e4m3_block_scale(amax)
    _, mag = nvfp4.e2m1_code(vg, scale)  # thresholds >= 2**-11: no subnormal arithmetic
    out = _bits(mag * scale)
  else:
    k = _ue8m0_exponent(jnp.maximum(amax, np.float32(mode.floor)), 448.0 if mode.fp8 else 6.0)
    out = (_e4m3_pow2 if mode.fp8 else _e2m1_pow2)(ax_bits, k)
  # The values have at most 6 significant bits, so the top half of the FP32 pattern is
  # the exact BF16 pattern, subnormals included.
  out = lax.shift_right_logical(out | sign, np.int32(16)).astype(jnp.uint16)
  return lax.bitcast_convert_type(out, jnp.bfloat16).reshape(v.shape)


@functools.partial(jax.jit, static_argnames="mode")
def rope_qdq(x, cache, row_positions, mode: Mode):
  """Reference of the fused op on validated inputs.

  x: [R, width] bf16; cache: [P, 64] fp32; row_positions: [R] int (one per row,
  clamped into [0, P) like the kernel's reads). Returns [R, width] bf16.
  """
  x32 = x.astype(jnp.float32)  # exact, bit for bit
  pos = jnp.clip(row_positions.astype(jnp.int32), 0, cache.shape[0] - 1)
  rows = cache[pos]  # [R, 64]
  tail = x32[:, -ROPE_CHANNELS:].reshape(-1, ROPE_CHANNELS // 2, 2)
  real, imag = rope(tail[..., 0], tail[..., 1], rows[:, :32], rows[:, 32:])
  tail = jnp.stack([real, imag], axis=-1).reshape(-1, ROPE_CHANNELS)
  return qdq(jnp.concatenate([x32[:, :-ROPE_CHANNELS], tail], axis=-1), mode)
