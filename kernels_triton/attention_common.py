"""Device functions shared by the attention forward and backward kernels, and the flags they read.

Framework-free (Triton only). The dtype-dependent flags come from :func:`dot_flags`
on the host; the kernels pass them through unchanged.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # the softmax runs on exp2 with log2(e) folded into the scale
LN2 = tl.constexpr(0.6931471805599453)
# log2 of p_scale="row"'s range R = 6 * 448 (ffi.options.P_ROW_RANGE; the kernels assert they were given it).
LOG2_P_ROW_RANGE = tl.constexpr(math.log2(6.0 * 448.0))


def dot_flags(dtype_name: str, interpret: bool = False) -> dict:
  """Constexpr dot/rounding flags for inputs of ``dtype_name`` ("bfloat16", "float16" or "float32").

  QK_F32: Q @ K^T on FP32 operands (fp32 inputs, and the interpreter, whose
    dot reads bf16 storage as integers); otherwise in the input dtype.
  DOT_BF16: ``bf16_dot`` runs on bf16 tensor cores (bf16 inputs on a GPU).
  DOT_PREC: FP32 dot precision: "ieee" for fp32 inputs (tf32 would round them);
    "tf32" for fp16 inputs, exact there since bf16 and fp16 values fit tf32.
  SOFT_BF16: round to bf16 with integer ops (the interpreter truncates).
  """
  fp32 = dtype_name == "float32"
  return {"QK_F32": fp32 or interpret, "DOT_BF16": dtype_name == "bfloat16" and not interpret,
          "DOT_PREC": "ieee" if fp32 or interpret else "tf32", "SOFT_BF16": interpret}


@triton.jit
def aligned3(a, b, c):
  """The three strides, known to be multiples of 16 elements, in a form the compiler can see.

  ``tl.multiple_of`` on a kernel argument is dropped (no defining op to carry the
  hint); ``x // 16 * 16`` is the identity here and its divisibility is inferred.
  """
  return a // 16 * 16, b // 16 * 16, c // 16 * 16


@triton.jit
def round_bf16(x, SOFT_BF16: tl.constexpr):
  """FP32 ``x`` rounded to bf16 (nearest even), as a bf16 tensor."""
  if SOFT_BF16:
    b = x.to(tl.int32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & -0x10000
    return b.to(tl.float32, bitcast=True).to(tl.bfloat16)  # exact: the low bits are 0
  else:
    return x.to(tl.bfloat16)


@triton.jit
def cast_out(x, ptr, SOFT_BF16: tl.constexpr):
  """FP32 ``x`` in the element type of ``ptr``, rounded to nearest even."""
  if ptr.dtype.element_ty == tl.bfloat16:
    return round_bf16(x, SOFT_BF16)
  else:
    return x.to(ptr.dtype.element_ty)


@triton.jit
def qk_dot(a, b_t, QK_F32: tl.constexpr, DOT_PREC: tl.constexpr):
  """``a @ b_t^T`` in FP32; ``a: [M, D]``, ``b_t: [N, D]`` in the input dtype."""
  if QK_F32:
    return tl.dot(a.to(tl.float32), tl.trans(b_t.to(tl.float32)), input_precision=DOT_PREC)
  else:
    return tl.dot(a, tl.trans(b_t))


@triton.jit
def bf16_dot(a, b, DOT_BF16: tl.constexpr, DOT_PREC: tl.constexpr, SOFT_BF16: tl.constexpr):
  """``bf16(a) @ b`` in FP32: ``a`` (probabilities or dS, FP32) is rounded to bf16 as the SPEC says."""
  a = round_bf16(a, SOFT_BF16)
  if DOT_BF16:
    return tl.dot(a, b)
  else:
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PREC)


@triton.jit
def load_kv_tile(k_base, v_base, start_n, offs_n, offs_d, kv_lim, stride_kt, stride_vt, HEAD_DIM: tl.constexpr,
                 MASKED: tl.constexpr):
  """K and V rows ``[start_n, start_n + BLOCK_N)`` of one KV head, ``[BLOCK_N, D_PAD]`` each; with MASKED,
  rows at or past ``kv_lim`` read as 0 (tiles without a ragged tail load unmasked). Channels at or past
  HEAD_DIM (the padding up to a power of two) read as 0."""
  kn = start_n + offs_n
  k_ptrs = k_base + tl.cast(start_n, tl.int64) * stride_kt + offs_n[:, None] * stride_kt + offs_d[None, :]
  v_ptrs = v_base + tl.cast(start_n, tl.int64) * stride_vt + offs_n[:, None] * stride_vt + offs_d[None, :]
  d_ok = offs_d[None, :] < HEAD_DIM
  if MASKED:
    k = tl.load(k_ptrs, mask=(kn[:, None] < kv_lim) & d_ok, other=0.0)
    v = tl.load(v_ptrs, mask=(kn[:, None] < kv_lim) & d_ok, other=0.0)
  elif HEAD_DIM == offs_d.shape[0]:
    k = tl.load(k_ptrs)
    v = tl.load(v_ptrs)
  else:
    k = tl.load(k_ptrs, mask=d_ok, other=0.0)
    v = tl.load(v_ptrs, mask=d_ok, other=0.0)
  return k, v


@triton.jit
def mask_limits(b, tq, tk, q_len_ptr, kv_len_ptr, HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr,
                BOTTOM_RIGHT: tl.constexpr):
  """``(q_lim, kv_lim, off)`` of batch ``b``: live query rows ``[0, q_lim)``, live keys ``[0, kv_lim)``,
  and the diagonal offset of the causal mask and the window (0 top-left, Tk - Tq bottom-right)."""
  q_lim = tq
  kv_lim = tk
  if HAS_Q_LEN:
    q_lim = tl.minimum(tl.maximum(tl.load(q_len_ptr + b), 0), tq)
  if HAS_KV_LEN:
    kv_lim = tl.minimum(tl.maximum(tl.load(kv_len_ptr + b), 0), tk)
  off = 0
  if BOTTOM_RIGHT:
    off = tk - tq
  return q_lim, kv_lim, off


@triton.jit
def visible(rows, keys, seg_q, seg_k, q_lim, kv_lim, off, IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr,
            WINDOW_RIGHT: tl.constexpr, HAS_SEG: tl.constexpr):
  """The elementwise mask of a tile: key ``keys`` visible to query ``rows`` (SPEC section 3 masks).

  rows/seg_q and keys/seg_k broadcast against each other (``[M, 1]`` and ``[1, N]``, or transposed for
  the dK/dV kernel's ``[keys, queries]`` tiles); seg_q, seg_k are ignored without HAS_SEG.
  WINDOW_LEFT / WINDOW_RIGHT: the window sides, -1 for none.
  """
  ok = (keys < kv_lim) & (rows < q_lim)
  diag = rows + off
  if IS_CAUSAL:
    ok = ok & (keys <= diag)
  if WINDOW_LEFT >= 0:
    ok = ok & (keys >= diag - WINDOW_LEFT)
  if WINDOW_RIGHT >= 0:
    ok = ok & (keys <= diag + WINDOW_RIGHT)
  if HAS_SEG:
    ok = ok & (seg_q == seg_k)
  return ok


@triton.jit
def _clamp(x, lo, hi):
  return tl.minimum(tl.maximum(x, lo), hi)


@triton.jit
def kv_tile_range(start_m, q_lim, kv_lim, off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
                  HAS_SEG: tl.constexpr):
  """``(lo, a, c, hi)`` for the query block starting at ``start_m``: KV tiles ``[lo, a)`` and ``[c, hi)``
  need the elementwise mask, ``[a, c)`` are visible to every row of the block; tiles outside ``[lo, hi)``
  are hidden from every live row and skipped (they would add exactly nothing). ``lo``, ``a``, ``c`` are
  multiples of BLOCK_N, so the walk keeps the reference's tiles at absolute key offsets."""
  row_hi = tl.minimum(start_m + BLOCK_M, q_lim) - 1  # last live row of the block
  hi = kv_lim
  if IS_CAUSAL:
    hi = tl.minimum(hi, row_hi + off + 1)
  if WINDOW_RIGHT >= 0:
    hi = tl.minimum(hi, row_hi + off + WINDOW_RIGHT + 1)
  hi = tl.where(row_hi < start_m, 0, tl.maximum(hi, 0))
  lo = 0
  a = 0
  if WINDOW_LEFT >= 0:
    lo = tl.maximum(start_m + off - WINDOW_LEFT, 0) // BLOCK_N * BLOCK_N
    a = tl.cdiv(tl.maximum(start_m + BLOCK_M - 1 + off - WINDOW_LEFT, 0), BLOCK_N) * BLOCK_N
  c = kv_lim // BLOCK_N * BLOCK_N
  if IS_CAUSAL:
    c = tl.minimum(c, tl.maximum(start_m + off + 1, 0) // BLOCK_N * BLOCK_N)
  if WINDOW_RIGHT >= 0:
    c = tl.minimum(c, tl.maximum(start_m + off + WINDOW_RIGHT + 1, 0) // BLOCK_N * BLOCK_N)
  lo = tl.minimum(lo, hi)
  if HAS_SEG:
    a = hi  # segments are checked element by element on every tile
  a = _clamp(a, lo, hi)
  c = _clamp(c, a, hi)
  return lo, a, c, hi


@triton.jit
def q_tile_range(start_n, q_lim, kv_lim, off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
                 HAS_SEG: tl.constexpr):
  """``(lo, a, c, hi)`` for the key tile starting at ``start_n`` (the dK/dV kernel): query tiles
  ``[lo, a)`` and ``[c, hi)`` need the elementwise mask, ``[a, c)`` see every key of the tile; query
  rows outside ``[lo, hi)`` see none of them and are skipped. ``lo``, ``a``, ``c`` are multiples of BLOCK_M,
  and the tiles of ``[a, c)`` end at or before ``hi``: their rows are all live, so they load unmasked."""
  key_hi = tl.minimum(start_n + BLOCK_N, kv_lim) - 1  # last live key of the tile
  hi = q_lim
  if WINDOW_LEFT >= 0:
    hi = tl.minimum(hi, key_hi - off + WINDOW_LEFT + 1)
  hi = tl.where(key_hi < start_n, 0, tl.maximum(hi, 0))
  lo = 0
  a = 0
  if IS_CAUSAL:
    lo = tl.maximum(start_n - off, 0) // BLOCK_M * BLOCK_M
    a = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - off, 0), BLOCK_M) * BLOCK_M
  if WINDOW_RIGHT >= 0:
    lo = tl.maximum(lo, tl.maximum(start_n - off - WINDOW_RIGHT, 0) // BLOCK_M * BLOCK_M)
    a = tl.maximum(a, tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - off - WINDOW_RIGHT, 0), BLOCK_M) * BLOCK_M)
  c = hi // BLOCK_M * BLOCK_M  # a ragged last tile goes to the masked walk
  if WINDOW_LEFT >= 0:
    c = tl.minimum(c, tl.maximum(start_n - off + WINDOW_LEFT + 1, 0) // BLOCK_M * BLOCK_M)
  lo = tl.minimum(lo, hi)
  a = tl.where(start_n + BLOCK_N > kv_lim, hi, a)  # a ragged key tile is masked against every row
  if HAS_SEG:
    a = hi
  a = _clamp(a, lo, hi)
  c = _clamp(c, a, hi)
  return lo, a, c, hi


@triton.jit
def segments_sorted_kernel(q_seg_ptr, kv_seg_ptr, tq, tk, out_ptr, BLOCK: tl.constexpr):
  """``out[b] = 1`` when ``q_seg[b]`` ([B, Tq]) and ``kv_seg[b]`` ([B, Tk]) are both non-decreasing, else 0.

  The attention kernels narrow their tile ranges by binary search only where this holds (packed documents);
  elsewhere they walk every tile and rely on the elementwise mask. Grid: (B,).
  """
  b = tl.program_id(0).to(tl.int64)
  offs = tl.arange(0, BLOCK)
  bad = tl.sum(tl.zeros([BLOCK], tl.int32))
  for start in range(0, tq - 1, BLOCK):
    i = start + offs
    m = i < tq - 1
    x = tl.load(q_seg_ptr + b * tq + i, mask=m, other=0)
    y = tl.load(q_seg_ptr + b * tq + i + 1, mask=m, other=0)
    bad += tl.sum((m & (x > y)).to(tl.int32))
  for start in range(0, tk - 1, BLOCK):
    j = start + offs
    m = j < tk - 1
    x = tl.load(kv_seg_ptr + b * tk + j, mask=m, other=0)
    y = tl.load(kv_seg_ptr + b * tk + j + 1, mask=m, other=0)
    bad += tl.sum((m & (x > y)).to(tl.int32))
  tl.store(out_ptr + b, (bad == 0).to(tl.int32))


@triton.jit
def _search(seg_base, n, value, STRICT: tl.constexpr):
  """First index in [0, n) whose id is >= value (> value with STRICT), n if none; ids non-decreasing."""
  lo = n * 0
  hi = n
  while lo < hi:
    mid = (lo + hi) // 2
    x = tl.load(seg_base + mid)
    if STRICT:
      go_right = x <= value
    else:
      go_right = x < value
    lo = tl.where(go_right, mid + 1, lo)
    hi = tl.where(go_right, hi, mid)
  return lo


@triton.jit
def narrow_to_segments(lo, hi, seg_base, n, seg_min, seg_max, is_sorted, BLOCK: tl.constexpr):
  """``[lo, hi)`` narrowed to the indices whose segment id (``n`` ids at ``seg_base``) lies in
  ``[seg_min, seg_max]``, when the ids are non-decreasing (``is_sorted``); ``lo`` stays a multiple of BLOCK.
  Everything cut off holds other segments only, so it is hidden from every row: skipping it is exact."""
  first = _search(seg_base, n, seg_min, False)
  last = _search(seg_base, n, seg_max, True)
  new_hi = tl.where(is_sorted != 0, tl.minimum(hi, last), hi)
  new_lo = tl.where(is_sorted != 0, tl.maximum(lo, first // BLOCK * BLOCK), lo)
  return tl.minimum(new_lo, new_hi), new_hi
