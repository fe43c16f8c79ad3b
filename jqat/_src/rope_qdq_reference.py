"""Pure-JAX tail RoPE + microscaled QDQ (docs/NUMERICS.md, 9): the oracle of the kernel and the "xla" implementation.

Bit-exactness must not depend on what XLA (and LLVM / ptxas below it) does to
floating-point code on any backend, so the reference relies on nothing but
correctly rounded single IEEE additions and multiplications whose products are
exact, comparisons, and integer logic on the FP32 bit patterns:

- Excess precision. XLA:GPU runs ``SimplifyFPConversions`` whenever
  ``xla_allow_excess_precision`` is on (the default), which deletes
  ``f32 -> bf16 -> f32`` convert pairs: ``v.astype(bf16).astype(f32)`` is *not*
  a rounding there. (This is what broke the reference on an H200: the rotated
  values reached the quantizer unrounded, so E2M1/E4M3 ties went the wrong way.)
  Every BF16 rounding is therefore done with integer round-to-nearest-even on the
  bits (:func:`_round_bf16_bits`); the jaxpr holds no float-to-float convert at
  all (the BF16 input is widened on the bits too), which a test checks.
- FMA contraction. XLA may or may not contract ``a * b + c`` into an FMA (LLVM
  and ptxas fuse by default on GPUs). The RoPE FMA is computed explicitly: the
  FP32 cache value is split by masking its bits into 16 + 8 significant bits, so
  both partial products with the 8-bit BF16 operand are exact, and contracting an
  exact product into the following add changes nothing (``fma(a, c, d) ==
  fl(a*c + d)`` when ``a*c`` is exact). The three exact terms are summed with a
  single rounding by the TwoSum / round-to-odd algorithm of Boldo and Melquiond
  ("Emulation of FMA and correctly rounded sums", IEEE TC 2008). The separately
  rounded ``b * sin`` of the spec is also formed from the two exact partial
  products. No inexact product ever feeds an addition. The error-free transforms
  do assume that additions are not reassociated (XLA:GPU emits no ``reassoc``
  flag; ``--xla_cpu_enable_fast_math`` can break a bare TwoSum on CPU).
- Signed zeros. XLA may rewrite negations, subtractions and selects between
  ``-0.0``/``+0.0`` in ways that change only the sign of a zero, so every sign
  that IEEE fixes for a zero result is computed from the operands' bits with
  integer logic (product: xor of the signs; exact-zero sum: -0 only when both
  addends are -0) and forced onto the result's bits. Negation is a sign-bit flip.
- Flush to zero. XLA:CPU flushes subnormal FP32 results and inputs of
  arithmetic. The fp4/UE8M0 floor (``6 * 2**-126``) puts scales at ``2**-126``
  and outputs at ``2**-127``, so the quantizer compares and builds values as
  integer bit patterns (amax included), never doing float arithmetic below
  ``2**-126``. RoPE pairs below ``2**-40`` are rotated at ``2**64`` their size
  (scaled on the bits) and scaled back on the bits with round-to-nearest-even
  onto the subnormal grid, so no float op sees a subnormal. What remains: a
  rotated value whose exact FP32 value is subnormal is rounded twice (to 24 bits
  at the scaled size, then onto the subnormal grid) where the oracle rounds
  once; and cache values or products below ``2**-126`` follow the platform's
  flush.
- Approximate instructions. No division, ``log2``, ``exp2``, ``pow`` or ``ceil``
  is used: the UE8M0 exponent ``ceil(log2(t))`` is read off the bits of ``t``
  (exponent field, plus one if the mantissa is non-zero), and scales, their
  multiples and all rounding boundaries are built as bit patterns.

Non-finite values (the rule is in docs/NUMERICS.md): NaN and Inf would break
the error-free transforms (``Inf - Inf`` inside TwoSum), so a pair with a NaN or
Inf among ``a, b, cos, sin`` takes a separate path: every term of both FMAs then
involves a non-finite value, and the IEEE result (NaN or +-Inf) follows from the
special products decided on the bits. Pairs with a member of ``2**64`` or more
are rotated at ``2**-64`` their size, so a result past the FP32 range becomes
+-Inf on the way back instead of a NaN out of TwoSum; this is exact for cache
values below ``2**60`` in magnitude (a separately rounded ``b * sin`` that
overflows at full size is detected on the exponent bits), except that a partner
below about ``2**-62`` is rounded onto the subnormal grid at the scaled size.
The quantizer detects a NaN per group on the integer max of the magnitude
patterns (NaN patterns lie above +Inf) and writes the canonical BF16 NaN
``0x7FC0``; an infinite amax is clamped on the bits to the largest finite FP32
value, and rounding boundaries past the FP32 range become a pattern above every
finite BF16 value, so only an infinite element reaches the largest code.

Quantization is division-free like :mod:`jqat.nvfp4`: with a power-of-two or
E4M3 scale ``s`` every ``s * boundary`` is exact, so comparing ``|x|`` with it
decides the same code as the correctly rounded quotient (XLA rewrites ``x / s``
into ``x * (1 / s)``, which is not the same).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jqat._src import nvfp4

ROPE_CHANNELS = 64  # the rotated tail: 32 adjacent pairs


@dataclasses.dataclass(frozen=True)
class Mode:
  """One row of the table of docs/NUMERICS.md, section 9.2."""
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
_INF = np.int32(0x7F800000)
_FLT_MAX = np.int32(0x7F7FFFFF)  # largest finite FP32; no BF16 value equals it
_ABOVE_BF16 = _FLT_MAX
NAN_BF16 = 0x7FC0  # the one NaN pattern of the outputs: canonical positive quiet NaN


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


def _times_pow2_bits(value_bits, k, overflow):
  """FP32 bits of ``value * 2**k`` for positive normal ``value`` (given by its bits) and int32 ``k``.

  Built from the exponent field, so a subnormal result is produced exactly
  (rather than flushed) as long as the shift drops no set bit, which holds for
  the few-bit E2M1/E4M3 values and boundaries used here. A result past the FP32
  range gives the bits ``overflow``: ``_INF`` for a value (IEEE overflow of
  ``q * s``), ``_ABOVE_BF16`` for a rounding boundary (above every finite BF16
  value, below +Inf, so only an infinite element passes it).
  """
  biased = (value_bits >> 23) + k
  frac = value_bits & 0x7FFFFF
  subnormal = (frac | 0x800000) >> jnp.clip(1 - biased, 0, 31)
  normal = jnp.where(biased >= 1, (biased << 23) | frac, subnormal)
  return jnp.where(biased >= 255, overflow, normal)


# ----------------------------------------------------------------------------- RoPE


def _two_sum(x, y):
  """``s + err == x + y`` exactly, ``s = fl(x + y)`` (Knuth's TwoSum).

  Additions only: nothing to contract, and no ``/``. Needs additions that are
  not reassociated (true of XLA:GPU; ``s - x`` must not become ``y``).
  """
  s = x + y
  bb = s - x
  return s, (x - (s - bb)) + (y - bb)


def _add_round_to_odd(x, y):
  """``x + y`` rounded to odd: when inexact, the neighbour whose last mantissa bit is 1.

  The inexact case and its direction are read from TwoSum's error by comparisons;
  the odd neighbour is made by stepping the bit pattern, not by float arithmetic.
  """
  s, err = _two_sum(x, y)
  bits = _bits(s)
  away = (err > 0) == (s > 0)  # exact value is farther from zero than s
  fix = (err != 0) & ((bits & 1) == 0)
  return jnp.where(fix, _float(bits + jnp.where(away, np.int32(1), np.int32(-1))), s)


def _split16(c):
  """``c == hi + lo`` with ``hi`` the top 16 significant bits: a BF16 times either part is exact in FP32.

  ``hi`` is made by masking the bits (not Veltkamp's ``4097 * c`` split, whose
  inexact product followed by subtractions breaks under FMA contraction);
  ``c - hi`` is exact (same exponent, at most 8 significant bits left), so no
  rewrite of it can change its value.
  """
  hi = _float(_bits(c) & -256)
  return hi, c - hi


def _exact_product_terms(a, c):
  """Two FP32 numbers summing exactly to ``a * c`` for BF16-valued ``a`` (8 significant bits).

  8 x 16 and 8 x 8 significant bits fit in 24: both products are exact (while
  nothing underflows), so fusing either into a following add (FMA contraction)
  yields the same value as the separate multiply and add.
  """
  c_hi, c_lo = _split16(c)
  return a * c_hi, a * c_lo


def _fma(a, c, d):
  """``fma(a, c, d)`` in FP32 with a single rounding, for BF16-valued ``a``; exact while nothing underflows."""
  p1, p2 = _exact_product_terms(a, c)
  uh, ul = _two_sum(p1, d)
  th, tl = _two_sum(p2, uh)
  z = th + _add_round_to_odd(tl, ul)  # the one rounding (Boldo-Melquiond)
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

  ``p1 + p2`` may itself be contracted to ``fma(a, c_hi, p2)``: the same value, as
  ``a * c_hi`` is exact. The sign of a product is the xor of the operands' signs,
  zero or not; it is set on the bits because the sum of the partial products may
  sign a zero differently.
  """
  p1, p2 = _exact_product_terms(a, c)
  return _with_sign(p1 + p2, (_bits(a) ^ _bits(c)) & _SIGN)


def _round_bf16_bits(bits):
  """FP32 bits rounded to the nearest BF16 (ties to even), as FP32 bits with the low half clear.

  Integer RNE on the pattern: adding ``0x7FFF + lsb`` carries into the exponent
  exactly when rounding up crosses a binade (and to +-Inf past the largest BF16),
  and works unchanged on subnormal patterns, so it is ml_dtypes' conversion
  without any float op. ``v.astype(bf16).astype(f32)`` is not used: XLA:GPU
  deletes that convert pair (excess precision) and keeps the unrounded FP32 value.
  NaN stays a (quiet) NaN.
  """
  mag = bits & _MAGNITUDE
  rounded = (mag + (0x7FFF + ((mag >> 16) & 1))) & np.int32(-65536)
  rounded = jnp.where(mag > 0x7F800000, (mag | 0x400000) & np.int32(-65536), rounded)
  return rounded | (bits & _SIGN)


def _scale_down_bits(bits, k):
  """FP32 bits of ``|v| * 2**-k`` rounded to nearest even (subnormal results included), for ``0 <= k``.

  On the bits: a normal result only lowers the exponent field; a subnormal one
  shifts the significand onto the ``2**-149`` grid with an RNE decision on the
  shifted-out bits (a carry into the exponent field gives the smallest normal).
  No float multiply, so no flush to zero on CPU. The sign is not set.
  """
  mag = bits & _MAGNITUDE
  e = mag >> 23
  frac = mag & 0x7FFFFF
  m = frac | jnp.where(e > 0, np.int32(0x800000), np.int32(0))  # |v| = m * 2**(max(e, 1) - 150)
  t = jnp.maximum(e, 1) - k  # biased exponent of the result, if it is normal
  s = jnp.clip(1 - t, 0, 25)  # right shift onto the subnormal grid; m < 2**24, so 25 flushes all
  q = m >> s
  rem = m - (q << s)
  half = (np.int32(1) << s) >> 1
  up = (s > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
  return jnp.where((e > 0) & (t >= 1), (t << 23) | frac, q + up.astype(jnp.int32))


_TINY = 2.0**-40
_HUGE = 2.0**64
_UP = 64


def _scale_up(v):
  """``v * 2**64`` for FP32 ``v``, subnormal ``v`` included; +-Inf past the FP32 range.

  On the bits: a normal ``v`` gets 64 added to its exponent field; a subnormal
  one (``frac * 2**-149``) is normalized with a count of leading zeros. No float
  op, so a CPU that treats subnormal inputs as zero cannot lose it.
  """
  bits = _bits(v)
  frac = bits & 0x7FFFFF
  top = 31 - lax.clz(frac)  # position of the leading 1 of frac (frac > 0 when used)
  # v = 2**(top - 149) * (frac / 2**top): biased exponent top - 149 + 64 + 127.
  subnormal = ((top + (_UP - 22)) << 23) | ((frac << (23 - jnp.maximum(top, 0))) & 0x7FFFFF)
  exponent = (bits & 0x7F800000) >> 23
  normal = jnp.where(exponent + _UP >= 255, _INF | (bits & _SIGN), bits + (_UP << 23))
  scaled = jnp.where(exponent == 0, jnp.where(frac == 0, np.int32(0), subnormal) | (bits & _SIGN), normal)
  return _float(scaled)


def _special_product(x, y):
  """IEEE ``x * y`` when ``x`` or ``y`` is NaN or +-Inf (NaN, or +-Inf; ``Inf * 0`` is NaN), else +0.

  Decided on the bits: a float multiply on a CPU that treats subnormal inputs as
  zero would turn ``Inf * subnormal`` into NaN.
  """
  mx, my = _bits(x) & _MAGNITUDE, _bits(y) & _MAGNITUDE
  nan = (mx > _INF) | (my > _INF) | ((mx == _INF) & (my == 0)) | ((my == _INF) & (mx == 0))
  inf = jnp.where((mx == _INF) | (my == _INF), _INF | ((_bits(x) ^ _bits(y)) & _SIGN), np.int32(0))
  return _float(jnp.where(nan, np.int32(NAN_BF16 << 16), inf))


def _special_rope(a, b, cos, sin):
  """The IEEE rotation of a pair with a NaN or +-Inf among ``a, b, cos, sin``: both results are NaN or +-Inf.

  Every term involves all four inputs, so a non-finite one makes both FMAs
  non-finite, and their values follow from the special products alone: a finite
  exact product ``a * cos`` does not change an infinite sum, so it enters as 0.
  The separately rounded ``b * sin`` is an IEEE multiply where both are finite
  (it may overflow to Inf, as specified).
  """
  def rounded_product(x, y):
    finite = ((_bits(x) & _MAGNITUDE) < _INF) & ((_bits(y) & _MAGNITUDE) < _INF)
    return jnp.where(finite, x * y, _special_product(x, y))

  real = _special_product(a, cos) + _negate(rounded_product(b, sin))
  imag = _special_product(b, cos) + rounded_product(a, sin)
  return real, imag


def rope(a, b, cos, sin):
  """The rotated pair ``(bf16(fma(a, cos, -(b*sin))), bf16(fma(b, cos, a*sin)))`` as FP32 bit patterns (int32).

  a, b: [...] FP32 holding BF16 values; cos, sin: [...] FP32. IEEE semantics for
  NaN and +-Inf inputs and for results that overflow (to +-Inf).
  """
  # Pairs that are both tiny are rotated at 2**64 their size, so that products and
  # error terms stay normal; pairs with a huge member at 2**-64 their size, so that
  # nothing overflows before the one rounding. The results are scaled back on the bits.
  # The tests are integer compares of the magnitudes (subnormal a or b count as tiny, as
  # they are; NaN and Inf take the special path below).
  tiny_bits = np.int32(np.float32(_TINY).view(np.int32))
  huge_bits = np.int32(np.float32(_HUGE).view(np.int32))
  big = jnp.maximum(_bits(a) & _MAGNITUDE, _bits(b) & _MAGNITUDE)
  tiny = big < tiny_bits
  huge = big >= huge_bits
  down = lambda v: _float(_scale_down_bits(_bits(v), np.int32(_UP)) | _sign_bits(v))
  a_s = jnp.where(tiny, _scale_up(a), jnp.where(huge, down(a), a))
  b_s = jnp.where(tiny, _scale_up(b), jnp.where(huge, down(b), b))
  minus_b_sin, a_sin = _negate(_round_product(b_s, sin)), _round_product(a_s, sin)
  real = _fma(a_s, cos, minus_b_sin)
  imag = _fma(b_s, cos, a_sin)
  k = jnp.where(tiny, np.int32(_UP), np.int32(0))
  special_real, special_imag = _special_rope(a, b, cos, sin)
  finite = ((jnp.maximum(big, jnp.maximum(_bits(cos) & _MAGNITUDE, _bits(sin) & _MAGNITUDE))) < _INF)

  def back(v, term, special):
    # The sign bit of the FMA result (decided on the bits above for zeros) is carried
    # through unchanged: scaling back and rounding to BF16 act on the magnitude. A huge
    # pair's separately rounded product that overflows at full size (a cache value above 1)
    # is +-Inf there, and so is the FMA it feeds, whose exact product term is finite.
    scaled = jnp.where(huge, _bits(_scale_up(v)), _scale_down_bits(_bits(v), k) | _sign_bits(v))
    term_overflows = huge & (((_bits(term) >> 23) & 0xFF) + _UP >= 255)
    scaled = jnp.where(term_overflows, _INF | _sign_bits(term), scaled)
    return _round_bf16_bits(jnp.where(finite, scaled, _bits(special)))

  return back(real, minus_b_sin, special_real), back(imag, a_sin, special_imag)


# ------------------------------------------------------------------------ quantization


def _ue8m0_exponent(amax, limit):
  """k with ``2**k = 2**ceil(log2(fp32(amax * fp32(1 / limit))))``, for normal ``amax`` (after the floor).

  ``t = amax * fp32(1/limit)`` is one IEEE multiply, correctly rounded on every
  backend (it feeds no add, so there is nothing to contract; after the floor
  ``t >= fp32(6 * 2**-126) * fp32(1/6) > 2**-126`` is normal, so no flush). Its
  rounding matters and is the specified one (e.g. amax = 1.5 * 2**j gives exactly
  ``t = 2**(j - 2)``). ``ceil(log2(t))`` is then read exactly off the bits:
  unbiased exponent, plus one when the mantissa field is non-zero; no ``log2``,
  ``ceil`` or ``exp2`` instruction (approximate on GPUs) is involved.
  """
  tb = _bits(amax * np.float32(1.0 / limit))
  return ((tb >> 23) & 0xFF) - 127 + ((tb & 0x7FFFFF) != 0).astype(jnp.int32)


def _e2m1_pow2(ax_bits, k):
  """Bits of ``e2m1(|x| / 2**k) * 2**k`` (RNE, saturating), compared and built as integers.

  ``boundary * 2**k`` is built on the bits (exact, subnormal included), and
  non-negative FP32 patterns order like their values, so integer compares decide
  the code the correctly rounded quotient would; a tie goes to the even code.
  """
  code = jnp.zeros(ax_bits.shape, jnp.int32)
  for i, bound in enumerate(_const_bits(_E2M1_BOUNDS)):
    edge = _times_pow2_bits(jnp.int32(bound), k, _ABOVE_BF16)
    code = code + ((ax_bits > edge) | ((ax_bits == edge) & (i % 2 == 1))).astype(jnp.int32)
  out = _times_pow2_bits(jnp.asarray(_const_bits(_E2M1_VALUES))[code], k, _INF)
  return jnp.where(code == 0, 0, out)


def _e4m3_pow2(ax_bits, k):
  """Bits of ``e4m3(min(|x| / 2**k, 448)) * 2**k`` (RNE), by binary search over the 126 midpoints (integer compares)."""
  mids = jnp.asarray(_const_bits(_E4M3_MIDS))
  count = jnp.zeros(ax_bits.shape, jnp.int32)  # midpoints passed = the code
  for step in (64, 32, 16, 8, 4, 2, 1):
    cand = count + step
    j = jnp.minimum(cand, len(_E4M3_MIDS)) - 1  # midpoint between codes j and j + 1
    edge = _times_pow2_bits(mids[j], k, _ABOVE_BF16)
    past = (ax_bits > edge) | ((ax_bits == edge) & ((j & 1) == 1))  # a tie goes to the even code
    count = jnp.where((cand <= len(_E4M3_MIDS)) & past, cand, count)
  out = _times_pow2_bits(jnp.asarray(_const_bits(_E4M3_VALUES))[count], k, _INF)
  return jnp.where(count == 0, 0, out)


def qdq(bits, mode: Mode):
  """Quantize/dequantize ``[..., width]`` values given as FP32 bit patterns (int32, BF16 values); returns bf16."""
  bits = bits.reshape(bits.shape[:-1] + (-1, mode.group))
  ax_bits = bits & _MAGNITUDE
  sign = bits & _SIGN
  # amax as an integer max of the magnitude patterns (they order like the values, and every
  # NaN pattern lies above +Inf): exact, blind to a flush of subnormals, and it cannot drop a
  # NaN the way a float max may. An infinite amax counts as the largest finite FP32 value
  # (the scale of any huge group); the floor is applied on the bits too.
  floor_bits = np.int32(np.float32(mode.floor).view(np.int32))
  amax_bits = jnp.max(ax_bits, axis=-1, keepdims=True)
  has_nan = amax_bits > _INF
  amax = _float(jnp.clip(amax_bits, floor_bits, _FLT_MAX))
  if mode.e4m3_scale:
    # nvfp4's E4M3 scale is e4m3(max(amax / 6, 2**-9)): the same value as with the floor
    # 6 * 2**-9 applied first, since fl(amax / 6) >= 2**-9 iff amax >= 6 * 2**-9. It is a
    # binary search comparing amax with exact products 6 * midpoint (no division); the
    # E2M1 code compares |x| with exact products scale * boundary (all >= 2**-11, so no
    # subnormal arithmetic), and mag * scale is exact (2 x 4 significant bits).
    scale = nvfp4.e4m3_block_scale(amax)
    _, mag = nvfp4.e2m1_code(_float(ax_bits), scale)
    out = _bits(mag * scale)
  else:
    k = _ue8m0_exponent(amax, 448.0 if mode.fp8 else 6.0)
    out = (_e4m3_pow2 if mode.fp8 else _e2m1_pow2)(ax_bits, k)
  # The values have at most 6 significant bits, so the top half of the FP32 pattern is
  # the exact BF16 pattern, subnormals included; the input's sign (zeros too) is set back.
  # A group holding a NaN is NaN throughout, with the one canonical pattern.
  out = jnp.where(has_nan, np.int32(NAN_BF16 << 16), out | sign)
  out = lax.shift_right_logical(out, np.int32(16)).astype(jnp.uint16)
  return lax.bitcast_convert_type(out, jnp.bfloat16).reshape(bits.shape[:-2] + (-1,))


@functools.partial(jax.jit, static_argnames="mode")
def rope_qdq(x, cache, row_positions, mode: Mode):
  """Reference of the fused op on validated inputs.

  x: [R, width] bf16; cache: [P, 64] fp32; row_positions: [R] int32/int64 (one per row,
  clamped into [0, P) like the kernel's reads, in their own dtype: an int64 id of 2**31 or
  more reads row P - 1, never a wrapped one). Returns [R, width] bf16.
  """
  # BF16 -> FP32 on the bits (the BF16 pattern is the top half of the FP32 one): no
  # float convert in the graph for an excess-precision rule to touch.
  x_bits = lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.int32) << 16
  pos = jnp.clip(row_positions, 0, cache.shape[0] - 1).astype(jnp.int32)
  rows = cache[pos]  # [R, 64]
  tail = _float(x_bits[:, -ROPE_CHANNELS:]).reshape(-1, ROPE_CHANNELS // 2, 2)
  real, imag = rope(tail[..., 0], tail[..., 1], rows[:, :32], rows[:, 32:])
  tail_bits = jnp.stack([real, imag], axis=-1).reshape(-1, ROPE_CHANNELS)
  return qdq(jnp.concatenate([x_bits[:, :-ROPE_CHANNELS], tail_bits], axis=-1), mode)
