"""Independent NumPy oracle for tail RoPE + microscaled QDQ, written from SPEC section 4 without project code.

Method, chosen to share nothing with the implementations it checks:
- the FMA is computed in float64 (an FP32 product is exact there) with the
  TwoSum error of the addition, which settles the only double-rounding case
  (a float64 sum exactly on an FP32 midpoint); ``fma32_fraction`` is the
  rational-arithmetic definition it is tested against;
- scales and quotients use NumPy's IEEE FP32 multiply/divide; rounding is a
  nearest-value search over explicit E2M1/E4M3 tables (tests/oracle.py).
"""

from fractions import Fraction

import ml_dtypes
import numpy as np

from oracle import E2M1_VALUES, E4M3_VALUES, round_to_table

# quantization, group_size, scale_format -> (width, element table, limit, scale kind, amax floor, per token)
MODES = {
  ("fp4", 32, "ue8m0"): (128, E2M1_VALUES, 6.0, "ue8m0", 6.0 * 2.0**-126, True),
  ("fp8", 32, "ue8m0"): (512, E4M3_VALUES, 448.0, "ue8m0", 1e-4, False),
  ("fp4", 16, "e4m3"): (512, E2M1_VALUES, 6.0, "e4m3", 6.0 * 2.0**-9, False),
}


def fma32(a, b, c):
  """Correctly rounded FP32 ``a * b + c`` (one rounding) for float32 arrays."""
  a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
  p = a * b  # exact: 48 significant bits at most
  s = p + c
  bb = s - p
  err = (p - (s - bb)) + (c - bb)  # s + err == p + c exactly
  r = s.astype(np.float32)
  # Rounding s instead of s + err differs only when s is exactly halfway between two
  # FP32 neighbours and err != 0: then the exact value lies on err's side.
  other = np.nextafter(r, np.where(s > r, np.float32(np.inf), np.float32(-np.inf))).astype(np.float32)
  halfway = (s != r) & (s == (r.astype(np.float64) + other.astype(np.float64)) / 2) & (err != 0)
  toward_other = (err > 0) == (other.astype(np.float64) > r.astype(np.float64))
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
  v = float(n * ulp)
  return -v if q < 0 else v


def fma32_fraction(a: float, b: float, c: float) -> np.float32:
  """The definition: exact rational ``a * b + c`` rounded once to FP32 (IEEE signed-zero rules)."""
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
  cos, sin = cache[pos, :32], cache[pos, 32:]
  a, b = rows[:, width - 64::2], rows[:, width - 63::2]
  real = fma32(a, cos, -(b * sin))  # b * sin: one FP32 rounding (NumPy float32 multiply)
  imag = fma32(b, cos, a * sin)
  rows = rows.copy()
  rows[:, width - 64::2] = real.astype(ml_dtypes.bfloat16).astype(np.float32)
  rows[:, width - 63::2] = imag.astype(ml_dtypes.bfloat16).astype(np.float32)

  g = rows.reshape(rows.shape[0], -1, group_size)
  amax = np.maximum(np.abs(g).max(axis=-1, keepdims=True), np.float32(floor))
  if scale_kind == "ue8m0":
    t = amax * np.float32(1.0 / limit)  # FP32 product
    m, e = np.frexp(t.astype(np.float64))  # t = m * 2**e, m in [0.5, 1)
    scale = np.where(m == 0.5, np.ldexp(1.0, e - 1), np.ldexp(1.0, e))
  else:
    scale = round_to_table(amax / np.float32(6.0), E4M3_VALUES)  # FP32 quotient, then E4M3 RNE saturating
  y = np.minimum(np.abs(g) / scale.astype(np.float32), np.float32(limit))  # IEEE FP32 division
  q = round_to_table(y, table)
  out = np.copysign(q * scale, g)  # exact in float64; keeps -0
  return out.astype(np.float32).astype(ml_dtypes.bfloat16).reshape(x.shape)
