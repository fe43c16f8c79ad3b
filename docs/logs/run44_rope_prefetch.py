"""Run 44a variant of kernels_triton/rope_qdq.py at 4946c85: persistent programs that load the next row block before computing this one (run 44a). Measured slower; not kept."""

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
def _load_block(blk, x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, D: tl.constexpr, BLOCK_R: tl.constexpr,
                HEAD_BLOCK: tl.constexpr):
  HEAD: tl.constexpr = D - 64
  row32 = blk * BLOCK_R + tl.arange(0, BLOCK_R)
  row_ok = row32 < n_rows
  base = row32.to(tl.int64)[:, None] * D
  hc = tl.arange(0, HEAD_BLOCK)[None, :]
  if HEAD_BLOCK == HEAD:
    hmask = row_ok[:, None]
  else:
    hmask = row_ok[:, None] & (hc < HEAD)
  h = tl.load(x_ptr + base + hc, mask=hmask, other=0.0, eviction_policy="evict_first")
  tc = HEAD + tl.arange(0, 64)[None, :]
  t = tl.load(x_ptr + base + tc, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first")
  pos = tl.load(pos_ptr + row32 // heads, mask=row_ok, other=0).to(tl.int64)
  pos = tl.minimum(tl.maximum(pos, 0), n_pos - 1)
  cache_offs = pos[:, None] * 64 + tl.arange(0, 32)[None, :]
  cos = tl.load(cache_ptr + cache_offs, mask=row_ok[:, None], other=1.0, eviction_policy="evict_last")
  sin = tl.load(cache_ptr + cache_offs + 32, mask=row_ok[:, None], other=0.0, eviction_policy="evict_last")
  return h, t, cos, sin


@triton.jit
def _compute_block(blk, h, t, cos, sin, n_rows, out_ptr, D: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr,
                   E4M3_SCALE: tl.constexpr, AMAX_FLOOR: tl.constexpr, BLOCK_R: tl.constexpr,
                   HEAD_BLOCK: tl.constexpr, HW: tl.constexpr):
  HEAD: tl.constexpr = D - 64
  row32 = blk * BLOCK_R + tl.arange(0, BLOCK_R)
  row_ok = row32 < n_rows
  base = row32.to(tl.int64)[:, None] * D
  hc = tl.arange(0, HEAD_BLOCK)[None, :]
  if HEAD_BLOCK == HEAD:
    hmask = row_ok[:, None]
  else:
    hmask = row_ok[:, None] & (hc < HEAD)
  h = _qdq_tile(h.to(tl.float32), BLOCK_R, HEAD_BLOCK, GROUP, FP8, E4M3_SCALE, AMAX_FLOOR, HW)
  tl.store(out_ptr + base + hc, _to_bf16(h), mask=hmask, eviction_policy="evict_first")
  tc = HEAD + tl.arange(0, 64)[None, :]
  a, b = tl.split(tl.reshape(t.to(tl.float32), (BLOCK_R, 32, 2)))
  real = _round_bf16(tl.fma(a, cos, _negate(b * sin)), HW)
  imag = _round_bf16(tl.fma(b, cos, a * sin), HW)
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
                    HW: tl.constexpr):
  n_blk = tl.cdiv(n_rows, BLOCK_R)
  nprog = tl.num_programs(0)
  blk = tl.program_id(0)
  h, t, cos, sin = _load_block(blk, x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, D, BLOCK_R, HEAD_BLOCK)
  while blk < n_blk:
    nxt = blk + nprog
    h2, t2, cos2, sin2 = _load_block(nxt, x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, D, BLOCK_R, HEAD_BLOCK)
    _compute_block(blk, h, t, cos, sin, n_rows, out_ptr, D, GROUP, FP8, E4M3_SCALE, AMAX_FLOOR, BLOCK_R,
                   HEAD_BLOCK, HW)
    h, t, cos, sin = h2, t2, cos2, sin2
    blk = nxt
