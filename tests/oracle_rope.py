"""Independent NumPy oracle for tail RoPE + microscaled QDQ, written from docs/NUMERICS.md, 9, without project code.

Method, chosen to share nothing with the implementations it checks:
- the FMA is computed in float64 (an FP32 product is exact there) with the
  TwoSum error of the addition, which settles the only double-rounding case
  (a float64 sum exactly on an FP32 midpoint); ``fma32_fraction`` is the
  rational-arithmetic definition it is tested against;
- scales and quotients use NumPy's IEEE FP32 multiply/divide; rounding is a
  nearest-value search over explicit E2M1/E4M3 tables (tests/oracle.py);
- non-finite values (docs/NUMERICS.md): NaN and Inf go through IEEE float64
  arithmetic and NumPy's float32 casts; a group holding a NaN is replaced by the
  canonical NaN, and an infinite element enters the amax as the largest finite
  FP32 value (a NaN-ignoring max clipped to it).
"""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
from oracle import E2M1_VALUES, E4M3_VALUES, round_to_table

NAN_BF16 = 0x7FC0  # the canonical positive quiet NaN, the only NaN pattern the op writes

# quantization, group_size, scale_format -> (width, element table, limit, scale kind, amax floor, per token)
MODES = {
  ("fp4", 32, "ue8m0"): (128, E2M1_VALUES, 6.0, "ue8m0", 6.0 * 2.0**-126, True),
  ("fp8", 32, "ue8m0"): (512, E4M3_VALUES, 448.0, "ue8m0", 1e-4, False),
  ("fp4", 16, "e4m3"): (512, E2M1_VALUES, 6.0, "e4m3", 6.0 * 2.0**-9, False),
}


def _value64(r):
  """float32 ``r`` as float64, +-Inf standing for +-2**128 (the rounding neighbour above the largest finite)."""
  r = r.astype(np.float64)
  return np.where(np.isinf(r), np.copysign(2.0**128, r), r)


def fma32(a, b, c):
  """Correctly rounded FP32 ``a * b + c`` (one rounding) for float32 arrays; IEEE NaN, Inf and overflow."""
  with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf follow IEEE rules, silently
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b  # exact: 48 significant bits at most (Inf * 0 is NaN, as in FP32)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # s + err == p + c exactly (NaN when s is not finite)
    r = s.astype(np.float32)  # past the FP32 range: +-Inf, IEEE overflow
    # Rounding s instead of s + err differs only when s is exactly halfway between two
    # FP32 neighbours and err != 0: then the exact value lies on err's side.
    other = np.nextafter(r, np.where(s > r, np.float32(np.inf), np.float32(-np.inf))).astype(np.float32)
    halfway = (s != r) & (s == (_value64(r) + _value64(other)) / 2) & (err != 0)
    toward_other = (err > 0) == (_value64(other) > _value64(r))
  return np.where(halfway & toward_other, other, r).astype(np.float32)


def _round_fraction_f32(q: Fraction) -> float:
  """Round a nonzero rational to the nearest FP32 value, ties to even (subnormals included)."""
  mag = abs(q)
  e = mag.numerator.bit_length() - mag.denominator.bit_length()
  if Fraction(2) ** e > mag:
    e -= 1
  ulp = Fraction(2) ** (max(e, -126) - 23)
  n, rem = divmod(mag, ulp)
  n = int(n) + (rem > ulp / 2 or (rem == ulp / 2 and int(n) % 2 == 1))
  v = float(n * ulp) if n * ulp < 2**128 else math.inf  # IEEE overflow: 2**128 after rounding
  return -v if q < 0 else v


def fma32_fraction(a: float, b: float, c: float) -> np.float32:
  """The definition: exact rational ``a * b + c`` rounded once to FP32 (IEEE signed-zero, NaN and Inf rules)."""
  if math.isnan(a) or math.isnan(b) or math.isnan(c):
    return np.float32(np.nan)
  if math.isinf(a) or math.isinf(b):
    if a == 0 or b == 0 or (math.isinf(c) and (c > 0) != ((a > 0) == (b > 0))):
      return np.float32(np.nan)  # Inf * 0, or Inf - Inf
    return np.float32(math.inf if (a > 0) == (b > 0) else -math.inf)
  if math.isinf(c):
    return np.float32(c)
  exact = Fraction(a) * Fraction(b) + Fraction(c)
  if exact == 0:
    prod_negative = np.signbit(a) != np.signbit(b)
    both_negative_zero = (a == 0 or b == 0) and prod_negative and c == 0 and np.signbit(c)
    return np.float32(-0.0 if both_negative_zero else 0.0)
  return np.float32(_round_fraction_f32(exact))


def rope_qdq_oracle(x, cache, positions, quantization="fp4", group_size=32, scale_format="ue8m0"):
  """x: bf16 (ml_dtypes) array; cache: [P, 64] float32; positions: ints (per token or per row). Returns bf16."""
  width, table, limit, scale_kind, floor, per_token = MODES[(quantization, group_size, scale_format)]
  x = np.asarray(x)
  rows = x.reshape(-1, width).astype(np.float32)
  pos = np.asarray(positions).reshape(-1).astype(np.int64)
  if per_token:
    pos = np.repeat(pos, x.shape[1])
  cache = np.asarray(cache, np.float32)
  pos = np.clip(pos, 0, cache.shape[0] - 1)  # ids outside [0, P) read the nearest row
  cos, sin = cache[pos, :32], cache[pos, 32:]
  a, b = rows[:, width - 64::2], rows[:, width - 63::2]
  with np.errstate(invalid="ignore", over="ignore"):
    real = fma32(a, cos, -(b * sin))  # b * sin: one FP32 rounding (NumPy float32 multiply, IEEE Inf/NaN)
    imag = fma32(b, cos, a * sin)
  rows = rows.copy()
  rows[:, width - 64::2] = real.astype(ml_dtypes.bfloat16).astype(np.float32)
  rows[:, width - 63::2] = imag.astype(ml_dtypes.bfloat16).astype(np.float32)

  g = rows.reshape(rows.shape[0], -1, group_size)
  nan = np.isnan(g).any(axis=-1, keepdims=True)
  # The non-finite rule: an infinite element counts as the largest finite FP32 value for the
  # amax, and is divided by the scale like any other (Inf / s = Inf, clamped to the limit).
  amax = np.where(np.isnan(g), np.float32(0), np.abs(g)).max(axis=-1, keepdims=True)
  amax = np.clip(amax, np.float32(floor), np.finfo(np.float32).max)
  if scale_kind == "ue8m0":
    t = amax * np.float32(1.0 / limit)  # FP32 product
    m, e = np.frexp(t.astype(np.float64))  # t = m * 2**e, m in [0.5, 1)
    scale = np.where(m == 0.5, np.ldexp(1.0, e - 1), np.ldexp(1.0, e))
  else:
    scale = round_to_table(amax / np.float32(6.0), E4M3_VALUES)  # FP32 quotient, then E4M3 RNE saturating
  with np.errstate(invalid="ignore", over="ignore"):
    y = np.minimum(np.abs(g) / scale.astype(np.float32), np.float32(limit))  # IEEE FP32 division
    q = round_to_table(np.where(nan, 0.0, y), table)
    out = np.copysign(q * scale, g).astype(np.float32)  # exact in float64 (keeps -0); past FP32: +-Inf
  out = out.astype(ml_dtypes.bfloat16).view(np.uint16)
  out = np.where(nan, np.uint16(NAN_BF16), out)  # a NaN anywhere makes the whole group this one NaN
  return out.view(ml_dtypes.bfloat16).reshape(x.shape)
