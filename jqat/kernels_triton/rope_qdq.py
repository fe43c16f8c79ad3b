"""Tail RoPE + microscaled quantize/dequantize, one fused in-place pass (docs/NUMERICS.md, section 9).

Framework-free: imports triton (and nvfp4's roundings). Each program handles ``BLOCK_R`` rows as 2-D
tiles, so every load and store is a wide, coalesced access:

- the head, channels ``[0, D - 64)``, is quantized/dequantized as read, in the tiles
  ``[BLOCK_R, D/2], [BLOCK_R, D/4], ..., [BLOCK_R, 64]`` (``D - 64`` is their sum, so no
  lane computes on a masked-off channel);
- the tail ``[BLOCK_R, 64]`` is split into its adjacent pairs, rotated with the
  cache row of the row's position, rounded to BF16 and quantized/dequantized.

Groups (16 or 32 channels) never straddle a tile boundary (every tile is a
multiple of 64 channels wide), so the tiles are independent. ``out`` is the same
buffer as ``x`` when called in place.

Numerics, all bit-exact with docs/NUMERICS.md, section 9, without any per-element division:
- RoPE: ``tl.fma`` is the single-rounding FP32 FMA; the product ``b * sin`` it
  subtracts is a separately rounded FP32 multiply, negated on the sign bit.
- Scales: UE8M0 takes the rounded product ``amax * fp32(1 / limit)`` and its
  power-of-two ceiling from the exponent/mantissa bits (no log2). E4M3 takes
  the correctly rounded ``amax / 6`` from a reciprocal and one FMA correction
  (Markstein), then rounds it to E4M3 (hardware ``cvt.rn.satfinite`` when HW).
- Elements: ``|v| * 2**-k`` is the exact quotient by a UE8M0 scale. For an E4M3
  scale ``s``, ``y0 = |v| * (1/s)`` corrected once (``nvfp4.corrected_quotient``:
  ``y = fma(fma(-y0, s, |v|), 1/s, y0)``) is exact whenever the quotient is
  representable (a rounding tie), and otherwise lies far from every E2M1
  boundary (a BF16 ``|v|`` differs from an exact ``s * boundary`` by at least
  2**-9 relative), so RNE of ``y`` is RNE of the correctly rounded quotient.
- RNE onto E2M1/E4M3: ``(y + M) - M`` with ``M`` the power of two whose FP32
  ulp is the target grid spacing at ``y`` (from ``y``'s exponent field): one
  integer max/add and two float adds; on the GPU, ``.to(tl.float8e4nv)`` for E4M3.
- ``q * s`` is exact (few significant bits) and exactly representable in BF16;
  the sign bit of the (rotated) input is OR-ed back so -0 stays -0.

Non-finite values (docs/NUMERICS.md), per group rather than per element: the
group amax is an integer max of the FP32 magnitude patterns (a float max may drop
a NaN; every NaN pattern lies above +Inf), a NaN group is written as the canonical
NaN ``0x7FC0`` and an infinite amax is clamped to the largest finite FP32 value
(one compare and one min per group). Per element: an infinite element's E4M3-scale
quotient is NaN after its FMA correction (``fma(Inf, -s, Inf)``); compiled, the
clamp to the limit (``min.f32``, which returns the non-NaN operand) makes it the
limit, and under the interpreter (NumPy's min keeps the NaN) ``|v|`` is capped at
``8 * s`` first; and the NaN select. BF16 is stored by truncating the FP32 bits (exact: the values are
BF16 values), because ``cvt.rn.bf16.f32`` writes its own NaN (PTX canonical ``0x7FFF``).
The rotation itself is IEEE (``tl.fma``); ids are clamped into ``[0, P)`` in int64.

``HW`` (constexpr) selects hardware conversions that the Triton interpreter
does not reproduce (it truncates FP32 -> BF16 and has no FP8 rounding): BF16
rounding by ``.to(tl.bfloat16)`` and E4M3 by ``.to(tl.float8e4nv)`` (sm_89+).
Without ``HW`` the same roundings are done on the bits.
"""

import triton
import triton.language as tl

from jqat.kernels_triton.nvfp4 import corrected_quotient, rcp_approx, round_e2m1, round_grid

ROPE = 64  # rotated tail channels
NAN_BITS = tl.constexpr(0x7FC00000)  # FP32 bits of the NaN written over a group holding a NaN (bf16 0x7FC0)


def launch_config(width: int, hw_e4m3: bool) -> dict:
  """Constexprs, ``num_warps`` and ``num_stages`` for rows of ``width`` channels (a power of two >= 128)."""
  block_r = max(1, 4096 // width)  # 4096 channels, 8 KiB of bf16, per program of 4 warps (the fastest measured)
  head_tiles = width.bit_length() - ROPE.bit_length()  # D/2, D/4, ..., 64: log2(D) - 6 tiles
  return dict(BLOCK_R=block_r, HEAD_TILES=head_tiles, HW=bool(hw_e4m3), num_warps=4, num_stages=2)


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
  """Per-group ``(scale, 1 / scale)`` from the group amax (FP32, any shape)."""
  amax = tl.maximum(amax, AMAX_FLOOR)
  if E4M3_SCALE:
    # Correctly rounded amax / 6: amax * fp32(1 / 6) is within an ulp, the residual is exact, and one
    # FMA with the rounded reciprocal lands on RN(amax / 6) (Markstein; no underflow here).
    t = corrected_quotient(amax, 6.0, 1.0 / 6.0)
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
  return scale, inv


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
def _qdq(v, scale, inv, nan, FP8: tl.constexpr, E4M3_SCALE: tl.constexpr, HW: tl.constexpr):
  """``sign(v) * round(min(|v| / scale, limit)) * scale`` as FP32 bits (int32), the canonical NaN
  where the group's ``nan`` is set; the per-group operands broadcast to ``v``."""
  av = tl.abs(v)
  if E4M3_SCALE:
    # The quotient, exact when representable. An infinite v gives NaN: compiled, the min.f32 below turns it into
    # the limit; under the interpreter (NumPy's min keeps a NaN) |v| is capped at 8 * scale first (exact, and every
    # element at or above it gives the limit, 6, either way).
    if not HW:
      av = tl.minimum(av, 8.0 * scale)
    y = corrected_quotient(av, scale, inv)
  else:
    y = av * inv  # exact for a power-of-two scale; +Inf for an infinite v, clamped to the limit below
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
  scale, inv = _scales(amax, FP8, E4M3_SCALE, AMAX_FLOOR, HW)
  out = _qdq(v3, scale[:, :, None], inv[:, :, None], nan[:, :, None], FP8, E4M3_SCALE, HW)
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
  # rows are gathered at random positions (evict_last). The load orders that were tried instead, and why they
  # were slower: docs/PERFORMANCE.md, section 8.
  # ---- the tail's cache rows first: the position ids, then the rows they select, are two dependent round trips
  # that would otherwise wait behind the head's loads, arithmetic and stores (ptxas keeps the program order here).
  # Positions outside [0, n_pos) are a caller error; clamping keeps the read in bounds
  # (and matches the clamping gather of the XLA reference).
  pos = tl.load(pos_ptr + row32 // heads, mask=row_ok, other=0).to(tl.int64)
  pos = tl.minimum(tl.maximum(pos, 0), n_pos - 1)
  cache_offs = pos[:, None] * 64 + tl.arange(0, 32)[None, :]
  cos = tl.load(cache_ptr + cache_offs, mask=row_ok[:, None], other=1.0, eviction_policy="evict_last")
  sin = tl.load(cache_ptr + cache_offs + 32, mask=row_ok[:, None], other=0.0, eviction_policy="evict_last")

  # ---- head: channels [0, D - 64), as read, in tiles of D/2, D/4, ..., 64 channels.
  for i in tl.static_range(HEAD_TILES):
    hc = (D - (D >> i)) + tl.arange(0, D >> (i + 1))[None, :]
    h = tl.load(x_ptr + base + hc, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first").to(tl.float32)
    h = _qdq_tile(h, BLOCK_R, D >> (i + 1), GROUP, FP8, E4M3_SCALE, AMAX_FLOOR, HW)
    tl.store(out_ptr + base + hc, _to_bf16(h), mask=row_ok[:, None], eviction_policy="evict_first")

  # ---- tail: the 32 adjacent pairs of channels [D - 64, D).
  tc = HEAD + tl.arange(0, 64)[None, :]
  t = tl.load(x_ptr + base + tc, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first").to(tl.float32)
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
  scale, inv = _scales(amax, FP8, E4M3_SCALE, AMAX_FLOOR, HW)
  scale, inv, nan = scale[:, :, None], inv[:, :, None], nan[:, :, None]
  re3 = _qdq(re3, scale, inv, nan, FP8, E4M3_SCALE, HW)
  im3 = _qdq(im3, scale, inv, nan, FP8, E4M3_SCALE, HW)
  y = tl.reshape(tl.join(tl.reshape(re3, (BLOCK_R, 32)), tl.reshape(im3, (BLOCK_R, 32))), (BLOCK_R, 64))
  tl.store(out_ptr + base + tc, _to_bf16(y), mask=row_ok[:, None], eviction_policy="evict_first")
