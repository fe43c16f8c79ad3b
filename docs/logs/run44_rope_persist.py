"""Run 44a variant of kernels_triton/rope_qdq.py at 4946c85: persistent programs over row blocks, Triton's pipeliner (run 44a). Measured slower; not kept."""

import triton
import triton.language as tl

from run44_rope_base import rope_4946c85 as _base  # docs/logs on sys.path (run44_rope_ab.py)

ROPE = _base.ROPE
_group_amax = _base._group_amax
_negate = _base._negate
_qdq = _base._qdq
_qdq_tile = _base._qdq_tile
_round_bf16 = _base._round_bf16
_scales = _base._scales
_to_bf16 = _base._to_bf16
launch_config = _base.launch_config


@triton.jit
def _rope_block(blk, x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, out_ptr,
                    D: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr, E4M3_SCALE: tl.constexpr,
                    AMAX_FLOOR: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_BLOCK: tl.constexpr,
                    HW: tl.constexpr):
  """x, out: [n_rows, D] bf16 (the same buffer in place); cache: [n_pos, 64] fp32;
  pos: [n_rows // heads] int32/int64 (row r uses pos[r // heads]).

  Grid: (cdiv(n_rows, BLOCK_R),). D, GROUP, BLOCK_R and HEAD_BLOCK >= D - 64 are powers
  of two, D >= 128. HW: hardware BF16/E4M3 conversions (compiled for sm_89+, see above).
  """
  HEAD: tl.constexpr = D - 64
  # 64-bit row offsets: 4M rows of 512 channels already pass 2**31 elements.
  row32 = blk * BLOCK_R + tl.arange(0, BLOCK_R)  # n_rows is an int32
  row_ok = row32 < n_rows
  base = row32.to(tl.int64)[:, None] * D

  # x is streamed (read and written once: evict_first) so that it does not push the cache out of L2, whose
  # rows are gathered at random positions (evict_last). Figures, and the load order that was tried instead:
  # docs/BENCHMARKS.md, run 33.
  # ---- head: channels [0, D - 64), as read.
  hc = tl.arange(0, HEAD_BLOCK)[None, :]
  if HEAD_BLOCK == HEAD:
    hmask = row_ok[:, None]
  else:
    hmask = row_ok[:, None] & (hc < HEAD)
  h = tl.load(x_ptr + base + hc, mask=hmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
  h = _qdq_tile(h, BLOCK_R, HEAD_BLOCK, GROUP, FP8, E4M3_SCALE, AMAX_FLOOR, HW)
  tl.store(out_ptr + base + hc, _to_bf16(h), mask=hmask, eviction_policy="evict_first")

  # ---- tail: the 32 adjacent pairs of channels [D - 64, D).
  tc = HEAD + tl.arange(0, 64)[None, :]
  t = tl.load(x_ptr + base + tc, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first").to(tl.float32)
  a, b = tl.split(tl.reshape(t, (BLOCK_R, 32, 2)))  # channels 2p and 2p + 1
  # Positions outside [0, n_pos) are a caller error; clamping keeps the read in bounds
  # (and matches the clamping gather of the XLA reference).
  pos = tl.load(pos_ptr + row32 // heads, mask=row_ok, other=0).to(tl.int64)
  pos = tl.minimum(tl.maximum(pos, 0), n_pos - 1)
  cache_offs = pos[:, None] * 64 + tl.arange(0, 32)[None, :]
  cos = tl.load(cache_ptr + cache_offs, mask=row_ok[:, None], other=1.0, eviction_policy="evict_last")
  sin = tl.load(cache_ptr + cache_offs + 32, mask=row_ok[:, None], other=0.0, eviction_policy="evict_last")
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


@triton.jit
def rope_qdq_kernel(x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, out_ptr,
                    D: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr, E4M3_SCALE: tl.constexpr,
                    AMAX_FLOOR: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_BLOCK: tl.constexpr,
                    HW: tl.constexpr, NSTAGE: tl.constexpr = 3):
  n_blk = tl.cdiv(n_rows, BLOCK_R)
  for blk in tl.range(tl.program_id(0), n_blk, tl.num_programs(0), num_stages=NSTAGE):
    _rope_block(blk, x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, out_ptr, D, GROUP, FP8, E4M3_SCALE,
                AMAX_FLOOR, BLOCK_R, HEAD_BLOCK, HW)
