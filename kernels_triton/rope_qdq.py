"""Tail RoPE + microscaled quantize/dequantize, one fused in-place pass (SPEC section 4).

Framework-free: imports triton only. Each program reads ``BLOCK_R`` rows of
``x`` once, rotates the adjacent pairs of the last 64 channels with the cache
row of the row's position, rounds the rotated tail to BF16, then
quantizes/dequantizes every channel in groups of ``GROUP`` and writes the rows
back to ``out`` (the same buffer as ``x`` when called in place).

Numerics, all bit-exact with the spec:
- RoPE: ``tl.fma`` is the single-rounding FP32 FMA; the product ``b * sin`` it
  subtracts is a separately rounded FP32 multiply, as the spec writes it.
- Scales: UE8M0 takes the rounded product ``amax * fp32(1 / limit)`` and its
  power-of-two ceiling from the exponent/mantissa bits (no log2, which is not
  exact); E4M3 takes ``tl.div_rn(amax, 6)`` and rounds it in software.
- Elements: ``tl.div_rn`` by an E4M3 scale (correctly rounded; plain ``/`` is
  not guaranteed to be on GPU), a multiply by the exact reciprocal of a
  power-of-two UE8M0 scale (the same correctly rounded quotient), clamp, then RNE onto E2M1/E4M3 with integer/magic-number tricks
  that behave the same compiled and under ``TRITON_INTERPRET=1``.
- ``q * s`` is exact (few significant bits) and exactly representable in BF16;
  the sign bit of the (rotated) input is OR-ed back so -0 stays -0.
"""

import triton
import triton.language as tl


@triton.jit
def _round_bf16(v):
  """FP32 ``v`` (finite) rounded to BF16, ties to even, kept in FP32.

  Done on the bits rather than with ``.to(tl.bfloat16)`` because the Triton
  interpreter truncates that cast; compiled, this is a handful of integer ops.
  """
  bits = v.to(tl.int32, bitcast=True)
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # clear the low 16 bits
  return bits.to(tl.float32, bitcast=True)


@triton.jit
def _negate(v):
  """``-v`` with IEEE semantics: Triton lowers unary minus to ``0 - v``, which turns -0 into +0."""
  return (v.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.float32, bitcast=True)


@triton.jit
def _round_e2m1(y):
  """RNE of non-negative FP32 ``y <= 6`` onto E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}."""
  # Below 1 the grid is 0.5: adding 2**22 (ulp 0.5) makes the FP32 add round RNE onto it.
  sub = (y + 4194304.0) - 4194304.0
  # From 1 up, keep one mantissa bit: add half an ulp of the kept bit minus 1, plus the
  # kept LSB (ties to even), then truncate.
  bits = y.to(tl.int32, bitcast=True)
  bits = (bits + 0x1FFFFF + ((bits >> 22) & 1)) & -4194304  # clear the low 22 bits
  return tl.where(y < 1.0, sub, bits.to(tl.float32, bitcast=True))


@triton.jit
def _round_e4m3(y):
  """RNE of non-negative FP32 ``y <= 448`` onto E4M3 (fn): 3 mantissa bits, subnormal grid 2**-9."""
  sub = (y + 16384.0) - 16384.0  # 2**14 has ulp 2**-9
  bits = y.to(tl.int32, bitcast=True)
  bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # clear the low 20 bits
  return tl.where(y < 0.015625, sub, bits.to(tl.float32, bitcast=True))


@triton.jit
def _qdq(v, scale, inv_scale, FP8: tl.constexpr, POW2: tl.constexpr):
  """``sign(v) * round(min(|v| / scale, limit)) * scale`` in FP32; the scales broadcast to ``v``.

  For a power-of-two ``scale`` (POW2), ``|v| * inv_scale`` with the exact reciprocal is the
  same correctly rounded quotient as ``tl.div_rn`` at a fraction of the instructions.
  """
  if POW2:
    y = tl.abs(v) * inv_scale
  else:
    y = tl.div_rn(tl.abs(v), scale)
  if FP8:
    q = _round_e4m3(tl.minimum(y, 448.0))
  else:
    q = _round_e2m1(tl.minimum(y, 6.0))
  mag = (q * scale).to(tl.int32, bitcast=True)
  sign = v.to(tl.int32, bitcast=True) & -2147483648
  return (mag | sign).to(tl.float32, bitcast=True)


@triton.jit
def rope_qdq_kernel(x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, out_ptr,
                    D: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr, E4M3_SCALE: tl.constexpr,
                    AMAX_FLOOR: tl.constexpr, BLOCK_R: tl.constexpr):
  """x, out: [n_rows, D] bf16 (the same buffer in place); cache: [n_pos, 64] fp32;
  pos: [n_rows // heads] int32/int64 (row r uses pos[r // heads]).

  Grid: (cdiv(n_rows, BLOCK_R),). D and GROUP are powers of two, D >= 64.
  """
  HALF: tl.constexpr = D // 2
  NG: tl.constexpr = D // GROUP
  TAIL0: tl.constexpr = HALF - 32  # first rotated pair
  # 64-bit row offsets: 4M rows of 512 channels already pass 2**31 elements.
  rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
  row_ok = rows < n_rows
  offs = rows[:, None] * D + tl.arange(0, D)[None, :]
  x = tl.load(x_ptr + offs, mask=row_ok[:, None], other=0.0).to(tl.float32)
  a, b = tl.split(tl.reshape(x, (BLOCK_R, HALF, 2)))  # channels 2p and 2p + 1

  # Positions outside [0, n_pos) are a caller error; clamping keeps the read in bounds
  # (and matches the clamping gather of the XLA reference).
  pos = tl.load(pos_ptr + rows // heads, mask=row_ok, other=0).to(tl.int64)
  pos = tl.minimum(tl.maximum(pos, 0), n_pos - 1)
  pair = tl.arange(0, HALF) - TAIL0
  tail = pair >= 0
  cache_offs = pos[:, None] * 64 + tl.where(tail, pair, 0)[None, :]
  in_tail = row_ok[:, None] & tail[None, :]
  cos = tl.load(cache_ptr + cache_offs, mask=in_tail, other=1.0)
  sin = tl.load(cache_ptr + cache_offs + 32, mask=in_tail, other=0.0)
  real = tl.fma(a, cos, _negate(b * sin))
  imag = tl.fma(b, cos, a * sin)
  # Only the tail is rotated; a where (not cos=1, sin=0) keeps the head's -0 exact.
  a = tl.where(tail[None, :], _round_bf16(real), a)
  b = tl.where(tail[None, :], _round_bf16(imag), b)

  # Group g holds pairs [g * GROUP/2, (g + 1) * GROUP/2): a pair never straddles groups.
  a = tl.reshape(a, (BLOCK_R, NG, GROUP // 2))
  b = tl.reshape(b, (BLOCK_R, NG, GROUP // 2))
  amax = tl.maximum(tl.max(tl.abs(a), axis=2), tl.max(tl.abs(b), axis=2))
  amax = tl.maximum(amax, AMAX_FLOOR)
  if E4M3_SCALE:
    scale = _round_e4m3(tl.minimum(tl.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)), 448.0))
    inv_scale = scale  # unused: E4M3 scales are not powers of two, the quotient uses div_rn
  else:
    # 2**ceil(log2(t)) of the rounded FP32 product t (normal, >= 2**-126 thanks to the floor):
    # the exponent of t, plus one unless t is already a power of two.
    if FP8:
      t = amax * (1.0 / 448.0)
    else:
      t = amax * (1.0 / 6.0)
    tb = t.to(tl.int32, bitcast=True)
    exp = (tb >> 23) + ((tb & 0x7FFFFF) != 0).to(tl.int32)
    scale = (exp << 23).to(tl.float32, bitcast=True)
    # The biased exponent stays in [1, 253] (floor below, bf16 range above), so 2**-k is normal.
    inv_scale = ((254 - exp) << 23).to(tl.float32, bitcast=True)
  scale = scale[:, :, None]
  inv_scale = inv_scale[:, :, None]
  a = _qdq(a, scale, inv_scale, FP8, not E4M3_SCALE)
  b = _qdq(b, scale, inv_scale, FP8, not E4M3_SCALE)

  y = tl.reshape(tl.join(tl.reshape(a, (BLOCK_R, HALF)), tl.reshape(b, (BLOCK_R, HALF))), (BLOCK_R, D))
  tl.store(out_ptr + offs, y.to(tl.bfloat16), mask=row_ok[:, None])  # exact: y holds BF16 values
