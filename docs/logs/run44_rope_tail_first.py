"""Run 44d variant of kernels_triton/rope_qdq.py: the tail's x loaded with the cache rows, before the head."""


import triton
import triton.language as tl

from jqat.kernels_triton.nvfp4 import rcp_approx, round_e2m1, round_grid

ROPE = 64  # rotated tail channels
NAN_BITS = tl.constexpr(0x7FC00000)  # FP32 bits of the NaN written over a group holding a NaN (bf16 0x7FC0)


def launch_config(width: int, hw_e4m3: bool) -> dict:
  """Constexprs, ``num_warps`` and ``num_stages`` for rows of ``width`` channels (a power of two >= 128)."""
  block_r = max(1, 8192 // width)  # 8192 channels, 16 KiB of bf16, per program
  head_tiles = width.bit_length() - ROPE.bit_length()  # D/2, D/4, ..., 64: log2(D) - 6 tiles
  return dict(BLOCK_R=block_r, HEAD_TILES=head_tiles, HW=bool(hw_e4m3), num_warps=8, num_stages=2)


@triton.jit
def _round_bf16(v, HW: tl.constexpr):
  """FP32 ``v`` rounded to BF16, ties to even, kept in FP32 (overflow gives +-Inf, a NaN stays a NaN)."""
  if HW:
    r = v.to(tl.bfloat16).to(tl.float32)  # cvt.rn.bf16.f32
  else:
    # On the magnitude, so no carry reaches the sign bit. A NaN's payload could carry past
    # bit 30 or round down to Inf, so a NaN becomes a quiet NaN, as cvt.rn.bf16.f32 makes it
    # (a per-element select, on Ampere and in the interpreter only).
    bits = v.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    mag = tl.where(mag > 0x7F800000, 0x7FC00000, (mag + 0x7FFF + ((mag >> 16) & 1)) & -65536)
    r = (mag | (bits & -2147483648)).to(tl.float32, bitcast=True)
  return r


@triton.jit
def _negate(v):
  """``-v`` with IEEE semantics: Triton lowers unary minus to ``0 - v``, which turns -0 into +0."""
  return (v.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.float32, bitcast=True)


@triton.jit
def _round_e4m3(y, HW: tl.constexpr):
  """RNE of non-negative FP32 ``y <= 448`` onto E4M3 (fn): 3 mantissa bits, subnormal grid 2**-9."""
  if HW:
    r = y.to(tl.float8e4nv).to(tl.float32)  # cvt.rn.satfinite.e4m3x2.f32 (sm_89+)
  else:
    r = round_grid(y, 121 << 23, 20 << 23)
  return r


@triton.jit
def _scales(amax, FP8: tl.constexpr, E4M3_SCALE: tl.constexpr, AMAX_FLOOR: tl.constexpr, HW: tl.constexpr):
  """Per-group ``(scale, 1 / scale, -scale)`` from the group amax (FP32, any shape)."""
  amax = tl.maximum(amax, AMAX_FLOOR)
  if E4M3_SCALE:
    # Correctly rounded amax / 6: t0 is within an ulp, the residual is exact, and one FMA
    # with the rounded reciprocal lands on RN(amax / 6) (Markstein; no underflow here).
    t0 = amax * (1.0 / 6.0)
    t = tl.fma(tl.fma(t0, -6.0, amax), 1.0 / 6.0, t0)
    scale = _round_e4m3(tl.minimum(t, 448.0), HW)  # >= 2**-9 thanks to the floor
    # Any faithful reciprocal will do (see the module docstring): compiled, one MUFU.RCP.
    inv = rcp_approx(scale) if HW else 1.0 / scale
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
    # The biased exponent stays in [1, 253] (floor below, amax <= FP32 max above), so 2**-k is normal.
    inv = ((254 - exp) << 23).to(tl.float32, bitcast=True)
  return scale, inv, 0.0 - scale


@triton.jit
def _group_amax(amax_bits):
  """``(amax, nan)`` of groups from the integer max of their FP32 magnitude patterns.

  Magnitude patterns order like the values and every NaN lies above +Inf, so the
  integer max sees a NaN that a float max (``max.f32`` drops NaN operands) would
  lose. An infinite amax counts as the largest finite FP32 value. Per group, not
  per element: one compare and one min.
  """
  nan = amax_bits > 0x7F800000
  amax = tl.minimum(amax_bits, 0x7F7FFFFF).to(tl.float32, bitcast=True)
  return amax, nan


@triton.jit
def _qdq(v, scale, inv, neg_scale, nan, FP8: tl.constexpr, E4M3_SCALE: tl.constexpr, HW: tl.constexpr):
  """``sign(v) * round(min(|v| / scale, limit)) * scale`` as FP32 bits (int32), the canonical NaN
  where the group's ``nan`` is set; the per-group operands broadcast to ``v``."""
  av = tl.abs(v)
  y = av * inv  # exact for a power-of-two scale; +Inf for an infinite v, clamped to the limit below
  if E4M3_SCALE:
    # The quotient, exact when representable. An infinite v gives fma(Inf, -s, Inf) = NaN: compiled, the min.f32
    # below turns it into the limit; under the interpreter (NumPy's min keeps a NaN) y is capped first (8 > 6 keeps
    # every clamped result at 6).
    if not HW:
      y = tl.minimum(y, 8.0)
    y = tl.fma(tl.fma(y, neg_scale, av), inv, y)
  if FP8:
    q = _round_e4m3(tl.minimum(y, 448.0), HW)
  else:
    q = round_e2m1(tl.minimum(y, 6.0))
  mag = (q * scale).to(tl.int32, bitcast=True)  # 6 * 2**126 and 448 * 2**120 overflow to +Inf
  sign = v.to(tl.int32, bitcast=True) & -2147483648
  return tl.where(nan, NAN_BITS, mag | sign)


@triton.jit
def _to_bf16(bits):
  """FP32 bits of a BF16 value as bf16, by truncation: exact, and keeps the NaN pattern that a
  ``cvt.rn.bf16.f32`` would replace by its own NaN (PTX canonical 0x7FFF)."""
  return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _qdq_tile(v, R: tl.constexpr, C: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr,
              E4M3_SCALE: tl.constexpr, AMAX_FLOOR: tl.constexpr, HW: tl.constexpr):
  """QDQ of ``v: [R, C]`` FP32 in groups of GROUP along axis 1; returns FP32 bits (int32)."""
  v3 = tl.reshape(v, (R, C // GROUP, GROUP))
  amax, nan = _group_amax(tl.max(v3.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2))
  scale, inv, neg = _scales(amax, FP8, E4M3_SCALE, AMAX_FLOOR, HW)
  out = _qdq(v3, scale[:, :, None], inv[:, :, None], neg[:, :, None], nan[:, :, None], FP8, E4M3_SCALE, HW)
  return tl.reshape(out, (R, C))


@triton.jit
def rope_qdq_kernel(x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, out_ptr,
                    D: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr, E4M3_SCALE: tl.constexpr,
                    AMAX_FLOOR: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_TILES: tl.constexpr,
                    HW: tl.constexpr):
  """x, out: [n_rows, D] bf16 (the same buffer in place); cache: [n_pos, 64] fp32;
  pos: [n_rows // heads] int32/int64 (row r uses pos[r // heads]).

  Grid: (cdiv(n_rows, BLOCK_R),). D, GROUP and BLOCK_R are powers of two, D >= 128, and
  HEAD_TILES = log2(D) - 6 (see launch_config). HW: hardware BF16/E4M3 conversions (compiled for sm_89+, see above).
  """
  HEAD: tl.constexpr = D - 64
  # 64-bit row offsets: 4M rows of 512 channels already pass 2**31 elements.
  row32 = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # n_rows is an int32
  row_ok = row32 < n_rows
  base = row32.to(tl.int64)[:, None] * D

  # x is streamed (read and written once: evict_first) so that it does not push the cache out of L2, whose
  # rows are gathered at random positions (evict_last). Figures, and the load order that was tried instead:
  # docs/BENCHMARKS.md, run 33.
  # ---- the tail's cache rows first: the position ids, then the rows they select, are two dependent round trips.
  # Positions outside [0, n_pos) are a caller error; clamping keeps the read in bounds
  # (and matches the clamping gather of the XLA reference).
  pos = tl.load(pos_ptr + row32 // heads, mask=row_ok, other=0).to(tl.int64)
  pos = tl.minimum(tl.maximum(pos, 0), n_pos - 1)
  cache_offs = pos[:, None] * 64 + tl.arange(0, 32)[None, :]
  cos = tl.load(cache_ptr + cache_offs, mask=row_ok[:, None], other=1.0, eviction_policy="evict_last")
  sin = tl.load(cache_ptr + cache_offs + 32, mask=row_ok[:, None], other=0.0, eviction_policy="evict_last")
  tc = HEAD + tl.arange(0, 64)[None, :]
  t = tl.load(x_ptr + base + tc, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first").to(tl.float32)

  # ---- head: channels [0, D - 64), as read, in tiles of D/2, D/4, ..., 64 channels.
  for i in tl.static_range(HEAD_TILES):
    hc = (D - (D >> i)) + tl.arange(0, D >> (i + 1))[None, :]
    h = tl.load(x_ptr + base + hc, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first").to(tl.float32)
    h = _qdq_tile(h, BLOCK_R, D >> (i + 1), GROUP, FP8, E4M3_SCALE, AMAX_FLOOR, HW)
    tl.store(out_ptr + base + hc, _to_bf16(h), mask=row_ok[:, None], eviction_policy="evict_first")

  # ---- tail: the 32 adjacent pairs of channels [D - 64, D).
  a, b = tl.split(tl.reshape(t, (BLOCK_R, 32, 2)))  # channels 2p and 2p + 1
  real = _round_bf16(tl.fma(a, cos, _negate(b * sin)), HW)
  imag = _round_bf16(tl.fma(b, cos, a * sin), HW)

  # Group g of the tail holds pairs [g * GROUP/2, (g + 1) * GROUP/2): a pair never straddles groups.
  NG: tl.constexpr = 64 // GROUP
  re3 = tl.reshape(real, (BLOCK_R, NG, GROUP // 2))
  im3 = tl.reshape(imag, (BLOCK_R, NG, GROUP // 2))
  amax_bits = tl.maximum(tl.max(re3.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2),
                         tl.max(im3.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2))
  amax, nan = _group_amax(amax_bits)
  scale, inv, neg = _scales(amax, FP8, E4M3_SCALE, AMAX_FLOOR, HW)
  scale, inv, neg, nan = scale[:, :, None], inv[:, :, None], neg[:, :, None], nan[:, :, None]
  re3 = _qdq(re3, scale, inv, neg, nan, FP8, E4M3_SCALE, HW)
  im3 = _qdq(im3, scale, inv, neg, nan, FP8, E4M3_SCALE, HW)
  y = tl.reshape(tl.join(tl.reshape(re3, (BLOCK_R, 32)), tl.reshape(im3, (BLOCK_R, 32))), (BLOCK_R, 64))
  tl.store(out_ptr + base + tc, _to_bf16(y), mask=row_ok[:, None], eviction_policy="evict_first")
