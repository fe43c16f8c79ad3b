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
def aligned_lengths(tq, tk, SEQ_ALIGN: tl.constexpr):
  """``tq, tk`` unchanged, in a form that shows the compiler their divisibility by ``SEQ_ALIGN``.

  SEQ_ALIGN: 16 when both lengths are multiples of 16 (``seq_align``), else 1. Triton's own launcher (the
  torch binding) marks integer arguments divisible by 16 itself; jax-triton marks none, and without the
  hint its forward compiled to a longer KV loop (docs/PERFORMANCE.md, section 3).
  """
  if SEQ_ALIGN > 1:
    tq = tq // SEQ_ALIGN * SEQ_ALIGN
    tk = tk // SEQ_ALIGN * SEQ_ALIGN
  return tq, tk


@triton.jit
def program_tile(HEAVIEST_FIRST: tl.constexpr, DESCENDING: tl.constexpr):
  """``(tile index along the sequence, batch * head index)`` of this program, of a grid
  ``(tiles, B * heads)``.

  Blocks are dispatched in launch order (``program_id(0)`` fastest). With a causal mask the tiles' work
  grows along the sequence (query tiles: with the index; key tiles: against it), and in launch order each
  head's heaviest tile would start last, the last head's after every other program: one whole tile's walk
  of tail with most SMs idle (18% of the causal forward kernel's time at 4k, measured on the H200).
  HEAVIEST_FIRST hands out the programs tile-major, every batch and head of one tile together, heaviest
  tile first (``DESCENDING``: from the last index), so the programs still running at the end are the
  shortest. Each program computes the same tile as before, only at another place in the order: the
  results are unchanged.
  """
  pid0 = tl.program_id(0)
  pid1 = tl.program_id(1)
  if HEAVIEST_FIRST:
    n0 = tl.num_programs(0)
    n1 = tl.num_programs(1)
    lin = pid1 * n0 + pid0  # launch order
    pid0 = lin // n1
    pid1 = lin % n1
    if DESCENDING:
      pid0 = n0 - 1 - pid0
  return pid0, pid1


@triton.jit
def program_start(strides, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr,
                  BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr, D_PAD: tl.constexpr, IS_CAUSAL: tl.constexpr,
                  BOTTOM_RIGHT: tl.constexpr, HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr,
                  HAS_SEG: tl.constexpr, QUERY_MAJOR: tl.constexpr, SEQ_ALIGN: tl.constexpr, SOFT_BF16: tl.constexpr,
                  EXACT: tl.constexpr):
  """The start of an attention program of a grid ``(tiles, B * heads)``: its arguments in the form its loads need,
  which tile it owns and what the masks say of it. QUERY_MAJOR (forward, dQ): a tile of BLOCK_OWN query rows of one
  query head, walking key tiles of BLOCK_OTHER; otherwise (dK/dV) a tile of BLOCK_OWN keys of one KV head, walking
  query tiles of BLOCK_OTHER.

  strides: the 12 strides (batch, sequence, head) of the program's four ``[B, T, heads, D]`` tensors, multiples of
  16 (``aligned3``); ``tq, tk`` as in ``aligned_lengths`` (SEQ_ALIGN 1: none). EXACT (an exact walk): the arguments
  and the program ids go through ``opaque`` first, so that the walk recomputes everything from its arguments
  instead of sharing values with the fast walks (which kept them live across those walks).

  Returns ``(strides, tq, tk, n_heads, group, pid_bh, b, head, start, offs_own, offs_other, offs_d, own_ok, q_lim,
  kv_lim, off, seg_own, other_seg_base)``: the arguments, the batch * head index, batch, head, first own index, the
  own, walked and channel offsets, which own indices lie below their length, ``mask_limits``, the own indices'
  segment ids (``offs_own`` without HAS_SEG) and this batch's segment ids of the walked axis (its pointer as given
  without HAS_SEG). Tiles are handed out longest walk first when causal (``program_tile``)."""
  s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11 = strides
  if EXACT:
    s0, s1, s2 = opaque(s0, SOFT_BF16), opaque(s1, SOFT_BF16), opaque(s2, SOFT_BF16)
    s3, s4, s5 = opaque(s3, SOFT_BF16), opaque(s4, SOFT_BF16), opaque(s5, SOFT_BF16)
    s6, s7, s8 = opaque(s6, SOFT_BF16), opaque(s7, SOFT_BF16), opaque(s8, SOFT_BF16)
    s9, s10, s11 = opaque(s9, SOFT_BF16), opaque(s10, SOFT_BF16), opaque(s11, SOFT_BF16)
    tq, tk, n_heads, group = opaque(tq, SOFT_BF16), opaque(tk, SOFT_BF16), opaque(n_heads, SOFT_BF16), opaque(
        group, SOFT_BF16)
  # jax-triton does not specialize integer arguments: without these hints the compiler cannot vectorize the tile
  # loads (it emitted 2-byte LDG.E.U16) nor pipeline them through cp.async.
  s0, s1, s2 = aligned3(s0, s1, s2)
  s3, s4, s5 = aligned3(s3, s4, s5)
  s6, s7, s8 = aligned3(s6, s7, s8)
  s9, s10, s11 = aligned3(s9, s10, s11)
  tq, tk = aligned_lengths(tq, tk, SEQ_ALIGN)
  heads = n_heads
  n_own, n_other, own_seg_ptr, other_seg_ptr = tq, tk, q_seg_ptr, kv_seg_ptr
  if not QUERY_MAJOR:
    heads = n_heads // group
    n_own, n_other, own_seg_ptr, other_seg_ptr = tk, tq, kv_seg_ptr, q_seg_ptr
  pid_t, pid_bh = program_tile(IS_CAUSAL, QUERY_MAJOR)  # causal: the longest walks first
  if EXACT:
    pid_t, pid_bh = opaque(pid_t, SOFT_BF16), opaque(pid_bh, SOFT_BF16)
  b = pid_bh // heads
  head = pid_bh % heads
  start = pid_t * BLOCK_OWN
  offs_own = start + tl.arange(0, BLOCK_OWN)
  offs_other = tl.arange(0, BLOCK_OTHER)
  offs_d = tl.arange(0, D_PAD)
  own_ok = offs_own < n_own
  q_lim, kv_lim, off = mask_limits(b, tq, tk, q_len_ptr, kv_len_ptr, HAS_Q_LEN, HAS_KV_LEN, BOTTOM_RIGHT)
  seg_own = offs_own
  other_seg_base = other_seg_ptr
  if HAS_SEG:
    seg_own = tl.load(own_seg_ptr + b.to(tl.int64) * n_own + offs_own, mask=own_ok, other=0)
    other_seg_base = other_seg_ptr + b.to(tl.int64) * n_other
  return ((s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11), tq, tk, n_heads, group, pid_bh, b, head, start,
          offs_own, offs_other, offs_d, own_ok, q_lim, kv_lim, off, seg_own, other_seg_base)


@triton.jit
def query_program_start(strides, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, IS_CAUSAL: tl.constexpr,
                        BOTTOM_RIGHT: tl.constexpr, HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr,
                        HAS_SEG: tl.constexpr, SEQ_ALIGN: tl.constexpr, SOFT_BF16: tl.constexpr, EXACT: tl.constexpr):
  """``program_start`` of a query-major program (the forward, dQ: a tile of BLOCK_M query rows of one head walking
  key tiles of BLOCK_N) over q, k, v and a fourth tensor (o, dO), whose strides ``strides`` lists in turn.

  Returns ``(strides, tq, tk, n_heads, group, pid_bh, b, h, kvh, start_m, offs_m, offs_n, offs_d, row_ok, q_lim,
  kv_lim, off, seg_q, kv_seg_base, stride_kt, stride_vt)``: ``program_start``'s values with the KV head ``kvh`` and
  the key and value sequence strides (``kv_bases`` gives where the KV head begins)."""
  (strides, tq, tk, n_heads, group, pid_bh, b, h, start_m, offs_m, offs_n, offs_d, row_ok, q_lim, kv_lim, off, seg_q,
   kv_seg_base) = program_start(strides, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, BLOCK_M,
                                BLOCK_N, D_PAD, IS_CAUSAL, BOTTOM_RIGHT, HAS_Q_LEN, HAS_KV_LEN, HAS_SEG, True,
                                SEQ_ALIGN, SOFT_BF16, EXACT)
  return (strides, tq, tk, n_heads, group, pid_bh, b, h, h // group, start_m, offs_m, offs_n, offs_d, row_ok, q_lim,
          kv_lim, off, seg_q, kv_seg_base, strides[4], strides[7])


@triton.jit
def kv_bases(k_ptr, v_ptr, strides, b, kvh):
  """Pointers to the first key and value of batch ``b``, KV head ``kvh`` (strides as in ``query_program_start``).
  Called where they are first needed, not in ``query_program_start``: computed before the query tile's loads, they
  changed the dQ kernel's register allocation (10 more instructions in its masked loop)."""
  return (k_ptr + b.to(tl.int64) * strides[3] + kvh.to(tl.int64) * strides[5],
          v_ptr + b.to(tl.int64) * strides[6] + kvh.to(tl.int64) * strides[8])


@triton.jit
def tile_rows(strides, TENSOR: tl.constexpr, b, head, offs):
  """Element offsets (int64, ``[len(offs), 1]``) of rows ``offs`` of batch ``b``, head ``head`` in tensor number
  TENSOR (0-3) of a program's four ``[B, T, heads, D]`` tensors, whose (batch, sequence, head) strides ``strides``
  lists in turn."""
  return (b.to(tl.int64) * strides[3 * TENSOR] + head.to(tl.int64) * strides[3 * TENSOR + 2]
          + offs.to(tl.int64)[:, None] * strides[3 * TENSOR + 1])


def seq_align(tq: int, tk: int) -> int:
  """The ``SEQ_ALIGN`` constexpr of the attention kernels for query and key lengths ``tq``, ``tk``."""
  return 16 if tq % 16 == 0 and tk % 16 == 0 else 1


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
  """``bf16(a) @ b`` in FP32: ``a`` (probabilities or dS, FP32) is rounded to bf16 (docs/NUMERICS.md, 4.3, 5)."""
  a = round_bf16(a, SOFT_BF16)
  if DOT_BF16:
    return tl.dot(a, b)
  else:
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PREC)


@triton.jit
def mul_rn(a, b, SOFT_BF16: tl.constexpr):
  """``a * b`` rounded once to FP32 and never contracted into an FMA with what consumes it.

  Compiled, ``mul.rn.f32``: PTX does not fuse an operation that has an explicit rounding modifier. The forward's
  scores ``s = (q . k) * c`` feed both the row max m and the exponent ``s - m``; contracted there, the exponent was
  ``fma(q . k, c, -m)``, the exact rounding error of s, and the max's p was not 1 (at huge logits 0 or +Inf: rows of
  zeros, lse of +-inf). With s rounded once, ``exp2(s - m)`` of the max is exp2(0) = 1. Cost: none in instructions
  (the product was computed on its own for the max anyway: FMUL + FFMA becomes FMUL + FADD). The interpreter
  (SOFT_BF16) never contracts: a plain product."""
  if SOFT_BF16:
    return a * b
  return tl.inline_asm_elementwise(asm="mul.rn.f32 $0, $1, $2;", constraints="=r,r,r", args=[a, b],
                                   dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def opaque(x, SOFT_BF16: tl.constexpr):
  """``x`` (int32) through an impure ``mov``: a value the compiler cannot prove equal to ``x``. The exact walks start
  their index arithmetic from it, so that common-subexpression elimination does not merge it with the fast walks'
  and keep the shared values live across them (pressure that spilled the capped O-only forward's loops). The
  interpreter (SOFT_BF16) has no asm: ``x``."""
  if SOFT_BF16:
    return x
  return tl.inline_asm_elementwise(asm="mov.b32 $0, $1;", constraints="=r,r", args=[x], dtype=tl.int32,
                                   is_pure=False, pack=1)


@triton.jit
def nan_of(x):
  """Where the tile ``x`` (any float dtype) holds a NaN; through FP32, which the interpreter's bf16 storage needs."""
  xf = x.to(tl.float32)
  return xf != xf


@triton.jit
def nan_hits(visible_tile, nan, DOT_BF16: tl.constexpr, DOT_PREC: tl.constexpr):
  """``[M, D]`` bool: row i meets a NaN in channel d through a visible pair, i.e. some j with ``visible_tile[i, j]``
  and ``nan[j, d]``: the boolean product as a dot of 0/1 operands (exact in bf16, tf32 and FP32: the counts are
  integers <= BLOCK). The exact path's guard (the reference's ``_dot``): a product over the pairs of a tile adds a
  NaN of the other operand only through visible pairs, where ``0 * NaN`` would add it through masked ones too."""
  a = visible_tile.to(tl.float32)
  b = nan.to(tl.float32)
  if DOT_BF16:
    c = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
  else:
    c = tl.dot(a, b, input_precision=DOT_PREC)
  return c > 0.0


@triton.jit
def any_nan(x, live):
  """Whether ``x`` (``[R, C]`` FP32) holds a NaN in a row where ``live`` (``[R]``) is set: one compare per element
  and a reduction, once per program (the trigger of the kernels' exact walk)."""
  return tl.max(tl.where(live[:, None] & (x != x), 1, 0)) > 0


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
  """The elementwise mask of a tile: key ``keys`` visible to query ``rows`` (docs/NUMERICS.md, section 4.2).

  rows/seg_q and keys/seg_k broadcast against each other (``[M, 1]`` and ``[1, N]``, or transposed for
  the dK/dV kernel's ``[keys, queries]`` tiles); seg_q, seg_k are ignored without HAS_SEG.
  WINDOW_LEFT / WINDOW_RIGHT: the window sides, -1 for none.

  A window bounded on both sides (the causal mask bounds the right side at 0) is one unsigned compare per
  element, ``keys - (diag - left)`` in ``[0, left + right]``, formed in 32 bits: written as two compares, the
  compiler fused them itself, widened to 64 bits (two compares and a carry each, and one select per condition).
  """
  ok = (keys < kv_lim) & (rows < q_lim)
  diag = rows + off
  RIGHT: tl.constexpr = 0 if IS_CAUSAL else WINDOW_RIGHT  # the right bound: causal caps any window side at 0
  if WINDOW_LEFT >= 0 and RIGHT >= 0:
    rel = (keys - diag + WINDOW_LEFT).to(tl.uint32, bitcast=True)
    ok = ok & (rel <= WINDOW_LEFT + RIGHT)
  else:
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
def row_tile_visible(offs_m, kn, seg_q, kv_seg_base, q_lim, kv_lim, off, IS_CAUSAL: tl.constexpr,
                     WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_SEG: tl.constexpr):
  """:func:`visible` for a ``[rows, keys]`` tile of the query-major kernels (forward, dQ): rows ``offs_m`` with
  segment ids ``seg_q``, keys ``kn``, whose segment ids it loads from ``kv_seg_base`` (with HAS_SEG)."""
  seg_k = kn
  if HAS_SEG:
    seg_k = tl.load(kv_seg_base + kn, mask=kn < kv_lim, other=0)
  return visible(offs_m[:, None], kn[None, :], seg_q[:, None], seg_k[None, :], q_lim, kv_lim, off, IS_CAUSAL,
                 WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG)


@triton.jit
def key_nan_hits(x_base, stride_xt, offs_c, lo, hi, offs_m, offs_n, seg_q, kv_seg_base, q_lim, kv_lim, off,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHANNELS: tl.constexpr,
                 IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
                 HAS_SEG: tl.constexpr, DOT_BF16: tl.constexpr, DOT_PREC: tl.constexpr):
  """``[BLOCK_M, CHANNELS]`` fp32, > 0 where row ``offs_m`` meets a NaN in channel ``offs_c`` of a key-major
  tensor (K or V of one head at ``x_base``, row stride ``stride_xt``) through a visible pair of the key tiles
  ``[lo, hi)``: the query-major exact walks' NaN pass (``nan_hits``)."""
  hits = tl.zeros([BLOCK_M, CHANNELS], tl.float32)
  for i in range(0, hi - lo, BLOCK_N):
    kn = lo + i + offs_n
    x = tl.load(x_base + kn.to(tl.int64)[:, None] * stride_xt + offs_c[None, :],
                mask=(kn[:, None] < kv_lim) & (offs_c[None, :] < HEAD_DIM), other=0.0)
    valid = row_tile_visible(offs_m, kn, seg_q, kv_seg_base, q_lim, kv_lim, off, IS_CAUSAL, WINDOW_LEFT,
                             WINDOW_RIGHT, HAS_SEG)
    hits += nan_hits(valid, nan_of(x), DOT_BF16, DOT_PREC).to(tl.float32)
  return hits


@triton.jit
def _clamp(x, lo, hi):
  return tl.minimum(tl.maximum(x, lo), hi)


@triton.jit
def kv_tile_range(start_m, q_lim, kv_lim, off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr):
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
  a = _clamp(a, lo, hi)
  c = _clamp(c, a, hi)
  return lo, a, c, hi


@triton.jit
def q_tile_range(start_n, q_lim, kv_lim, off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr):
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
  bad = _descents(q_seg_ptr + b * tq, tq, bad, offs, BLOCK)
  bad = _descents(kv_seg_ptr + b * tk, tk, bad, offs, BLOCK)
  tl.store(out_ptr + b, (bad == 0).to(tl.int32))


@triton.jit
def _descents(ids, n, bad, offs, BLOCK: tl.constexpr):
  """``bad`` plus the number of ``i < n - 1`` with ``ids[i] > ids[i + 1]``."""
  for start in range(0, n - 1, BLOCK):
    i = start + offs
    m = i < n - 1
    x = tl.load(ids + i, mask=m, other=0)
    y = tl.load(ids + i + 1, mask=m, other=0)
    bad += tl.sum((m & (x > y)).to(tl.int32))
  return bad


SEARCH_FANOUT = tl.constexpr(128)  # ids read at once per step of ``_search``


@triton.jit
def _search(seg_base, n, value, STRICT: tl.constexpr):
  """First index in [0, n) whose id is >= value (> value with STRICT), n if none; ids non-decreasing.

  A SEARCH_FANOUT-ary search: each step reads SEARCH_FANOUT evenly spaced ids of the interval left in one
  vector load and keeps the gap where the answer lies; 2 dependent loads for n <= 16384, 3 up to 2**21
  (a binary search waits on log2(n) loads one after another, at L2 latency each).
  """
  offs = tl.arange(0, SEARCH_FANOUT)
  lo = n * 0  # the answer lies in [lo, hi]
  hi = n
  while lo < hi:
    step = tl.cdiv(hi - lo, SEARCH_FANOUT)
    idx = lo + offs * step
    inside = idx < hi
    x = tl.load(seg_base + idx, mask=inside, other=0)
    if STRICT:
      below = inside & (x <= value)
    else:
      below = inside & (x < value)
    cnt = tl.sum(below.to(tl.int32))  # the samples below the answer: a prefix, the ids being sorted
    new_lo = tl.where(cnt > 0, lo + (cnt - 1) * step + 1, lo)  # past the last sample below
    hi = tl.minimum(hi, lo + cnt * step)  # at or before the first sample not below
    lo = new_lo
  return lo


@triton.jit
def narrow_to_segments(lo, a, c, hi, seg_own, live, seg_base, n, is_sorted, BLOCK: tl.constexpr):
  """The walk ``(lo, a, c, hi)`` of ``kv_tile_range`` / ``q_tile_range`` with segment ids.

  ``seg_own``: the segment ids of the program's own rows (or keys), ``live`` which of them count; ``n`` ids at
  ``seg_base`` along the walked axis. Unsorted ids (``is_sorted == 0``) keep ``[lo, hi)`` and mask every tile.
  Sorted ids (packed documents) narrow ``[lo, hi)`` to the indices of the segments ``seg_own`` holds: the
  rest belongs to other segments, hidden from every live row, so skipping it is exact. When every live own
  index lies in one segment, the tiles inside that segment's run of indices see it in full and stay
  unmasked (``[a, c)`` narrowed to them); otherwise every tile is masked. ``lo``, ``a``, ``c`` stay
  multiples of BLOCK.
  """
  seg_min = tl.min(tl.where(live, seg_own, 2147483647))
  seg_max = tl.max(tl.where(live, seg_own, -2147483648))
  first = _search(seg_base, n, seg_min, False)
  last = _search(seg_base, n, seg_max, True)
  srt = is_sorted != 0
  hi = tl.where(srt, tl.minimum(hi, last), hi)
  lo = tl.minimum(tl.where(srt, tl.maximum(lo, first // BLOCK * BLOCK), lo), hi)
  one = srt & (seg_min == seg_max)  # also false without a live own index (seg_min > seg_max)
  a = _clamp(tl.where(one, tl.maximum(a, tl.cdiv(first, BLOCK) * BLOCK), hi), lo, hi)
  c = _clamp(tl.where(one, tl.minimum(c, last // BLOCK * BLOCK), hi), a, hi)
  return lo, a, c, hi
