"""Run 44c diagnostic: kernels_triton/rope_qdq.py's loads and stores with no arithmetic (x copied onto itself in
place, tile by tile: the head in tiles of D/2, ..., 64 channels, the tail as one tile of 64), and the same as one
[BLOCK_R, D] tile per program. Their time against a copy is the ceiling of this access pattern."""

import triton
import triton.language as tl

from jqat.kernels_triton.rope_qdq import launch_config  # noqa: F401  (same constexprs as the kernel)


@triton.jit
def rope_qdq_kernel(x_ptr, cache_ptr, pos_ptr, n_rows, n_pos, heads, out_ptr,
                    D: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr, E4M3_SCALE: tl.constexpr,
                    AMAX_FLOOR: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_TILES: tl.constexpr,
                    HW: tl.constexpr, WHOLE_ROWS: tl.constexpr = False, GATHER: tl.constexpr = False):
  HEAD: tl.constexpr = D - 64
  row32 = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
  row_ok = row32 < n_rows
  base = row32.to(tl.int64)[:, None] * D
  if WHOLE_ROWS:
    c = tl.arange(0, D)[None, :]
    v = tl.load(x_ptr + base + c, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first")
    tl.store(out_ptr + base + c, v, mask=row_ok[:, None], eviction_policy="evict_first")
  else:
    for i in tl.static_range(HEAD_TILES):
      hc = (D - (D >> i)) + tl.arange(0, D >> (i + 1))[None, :]
      h = tl.load(x_ptr + base + hc, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first")
      tl.store(out_ptr + base + hc, h, mask=row_ok[:, None], eviction_policy="evict_first")
    tc = HEAD + tl.arange(0, 64)[None, :]
    t = tl.load(x_ptr + base + tc, mask=row_ok[:, None], other=0.0, eviction_policy="evict_first")
    if GATHER:  # the cache rows too, added in (so the loads are not dead): t + cos[pos] * 0 is not t for NaN/Inf
      pos = tl.load(pos_ptr + row32 // heads, mask=row_ok, other=0).to(tl.int64)
      pos = tl.minimum(tl.maximum(pos, 0), n_pos - 1)
      offs = pos[:, None] * 64 + tl.arange(0, 64)[None, :]
      cs = tl.load(cache_ptr + offs, mask=row_ok[:, None], other=0.0, eviction_policy="evict_last")
      t = (t.to(tl.float32) + cs).to(tl.bfloat16)
    tl.store(out_ptr + base + tc, t, mask=row_ok[:, None], eviction_policy="evict_first")
