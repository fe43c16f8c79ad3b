"""NVFP4 QAT attention forward (docs/NUMERICS.md, section 4) as one Triton kernel.

One program owns ``BLOCK_M`` query rows of one query head and walks the KV
tiles of ``BLOCK_N`` keys from key 0, exactly as the reference does (the
quantized probabilities depend on the running max at each tile). It writes

- ``O``  = (sum over tiles of fq(p_tilde) @ V_hat) / l   (quantized path),
- ``O'`` = (sum over tiles of bf16(p_tilde) @ V_hat) / l (for the backward's delta),
- ``lse`` = m + log(l), natural log, FP32, ``[B, N, Tq]``.

With ``p_scale="row"`` (``P_ROW_RANGE`` > 0, docs/NUMERICS.md) the quantized path
accumulates fq(R * p_tilde) @ V_hat, R = ``P_ROW_RANGE`` = 6 * 448, and divides by R * l; the
kernel also writes the final row max m (natural units) for the backward.

With ``qkv_scale="tensor"`` (``QKV_TENSOR``) Q, K, V are
two-level: fq(enc * X) with one FP32 encode scale per (batch, head) (``nvfp4.tensor_scale_kernel``), the
decode scales 1 / enc folded into the softmax scale (Q, K) and the final normalization (V).

K and V arrive already fake-quantized (``fake_quantize_rows_kernel`` writes fq(K),
fq(V) once, instead of every query block re-quantizing them); Q is quantized
here, once per program (QUANTIZE_Q), or arrives from the same pass (causal,
windowed, packed and D > 64 plans, ``jqat/ffi/plan.py``). The softmax runs in base 2 with log2(e) folded into
the scale: exp2(x * log2 e) equals exp(x) to within FP32 rounding, so fq(p)
rounds as in the reference except where p sits on a rounding boundary.
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from jqat.kernels_triton import attention_common as common
from jqat.kernels_triton.attention_common import (
  LN2,
  LOG2_P_ROW_RANGE,
  LOG2E,
  bf16_dot,
  cast_out,
  kv_tile_range,
  load_kv_tile,
  mul_rn,
  narrow_to_segments,
  qk_dot,
  row_tile_visible,
)
from jqat.kernels_triton.nvfp4 import cast_fq, fq_probs, fq_tile


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
  """Launch configuration of :func:`attention_fwd_kernel`: query rows per program, warps, pipeline stages, and a cap
  on registers per thread (``maxnreg``, 0 for none: ptxas then takes what it wants; a cap can fit one more program
  per SM, or spill, or serialize the wgmma: docs/PERFORMANCE.md, section 3).

  The KV tile ``BLOCK_N`` is not here: it changes the function computed (``block_n`` of the API).
  """

  block_m: int
  num_warps: int
  num_stages: int
  maxnreg: int = 0


# By head dim. The Q tile and the pipelined K/V tiles must fit Hopper's shared memory
# (D = 256 halves BLOCK_M). D = 128 and 64 are the fastest of the H200 sweeps (benchmarks/attention_sweep.py;
# docs/PERFORMANCE.md, section 3). D <= 64: 64 rows on 4 warps; O alone then takes 163 registers, so three
# programs (12 warps) share an SM, where 128 rows on 8 warps (172) left one (16-18% faster at D = 64).
FORWARD_CONFIGS = {64: ForwardConfig(64, 4, 3), 128: ForwardConfig(64, 4, 3), 256: ForwardConfig(64, 8, 2)}
# O alone (``RESIDUALS`` off: the primal's forward). At 32 < D <= 64, reading fq(Q) from the pass, it takes
# 140 registers (three programs per SM); capped at 128 it keeps its loops free of spills (4 B of stack outside them)
# and four programs share an SM: 1.5% faster at (2, 16, 4096, 64) and 2.3% at 16k on the H200, the same bits. The
# training forward stays uncapped: at 128 ptxas serializes its wgmma and it spills in every mask case.
OUT_CONFIGS = {**FORWARD_CONFIGS, 64: ForwardConfig(64, 4, 3, maxnreg=128)}


def forward_config(head_dim: int, residuals: bool = True) -> ForwardConfig:
  """The default :class:`ForwardConfig` for head dim ``head_dim`` (a multiple of 16); ``residuals=False``: of the
  kernel that computes O alone."""
  table = FORWARD_CONFIGS if residuals else OUT_CONFIGS
  return table[min((d for d in table if d >= head_dim), default=256)]


NAN_CHANNELS = tl.constexpr(16)  # channels per step of the exact walk's NaN pass


@triton.jit
def kv_descriptors(k_base, v_base, rows, stride_kt, stride_vt, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                   D_PAD: tl.constexpr):
  """Tensor descriptors (TMA) of one head's K and V: ``rows`` (> 0) rows of HEAD_DIM columns, [BLOCK_N, D_PAD]
  tiles; a copy fills what lies past the bounds with zeros. They live in the launch's global scratch (128 bytes
  each per program), which jqat.ffi's launchers provide. TMA needs 16-byte aligned bases and row strides: rows of
  D % 16 == 0 elements in buffers that XLA or the torch binding (jqat.torch._tensors.dense) aligns."""
  return (tl.make_tensor_descriptor(k_base, shape=[rows, HEAD_DIM], strides=[stride_kt, 1],
                                    block_shape=[BLOCK_N, D_PAD]),
          tl.make_tensor_descriptor(v_base, shape=[rows, HEAD_DIM], strides=[stride_vt, 1],
                                    block_shape=[BLOCK_N, D_PAD]))


@triton.jit
def _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, seg_q, kv_seg_base, q_lim,
             kv_lim, off, stride_kt, stride_vt, qk_scale, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr,
             IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_SEG: tl.constexpr,
             QUANTIZE_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QK_F32: tl.constexpr,
             DOT_BF16: tl.constexpr, SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr, HW_E4M3: tl.constexpr,
             HW_E2M1: tl.constexpr, P_ROW_RANGE: tl.constexpr, RUNTIME_MASK: tl.constexpr = False, edge=False,
             k_desc=None, v_desc=None, USE_TMA: tl.constexpr = False, O_ONLY: tl.constexpr = False,
             EXACT: tl.constexpr = False):
  """One KV tile of the online softmax; MASKED for tiles that a mask hides in part (``visible``).
  EXACT (with MASKED): the exact walk's tile (``attention_fwd_kernel``): V's NaN read as 0 in the products, so that no
  masked pair adds 0 * NaN (the walk's caller then sets the NaN that visible pairs carry).
  O_ONLY (with QUANTIZE_P): O' is not wanted; ``acc_hp`` is returned untouched (no P V_hat product).
  USE_TMA: K and V from the tensor descriptors ``k_desc``, ``v_desc`` (``kv_descriptors``; the copy fills rows past
  their bound with zeros, as the masked loads do).
  RUNTIME_MASK (with MASKED off): loads masked, the elementwise mask applied where ``edge`` (a runtime flag) is
  true; one loop walks a window's edge and middle tiles.

  P_ROW_RANGE: 0 for p_scale="block"; R > 0 quantizes R * p (p <= 1, its row max 1 maps to R = 6 * 448).
  """
  kn = start_n + offs_n
  if USE_TMA:
    k = k_desc.load([start_n, 0])
    v = v_desc.load([start_n, 0])
  else:
    k, v = load_kv_tile(k_base, v_base, start_n, offs_n, offs_d, kv_lim, stride_kt, stride_vt, HEAD_DIM,
                        MASKED or RUNTIME_MASK)
  s = mul_rn(qk_dot(q, k, QK_F32, DOT_PREC), qk_scale, SOFT_BF16)  # log2 units, rounded once (mul_rn)
  if MASKED:
    valid = row_tile_visible(offs_m, kn, seg_q, kv_seg_base, q_lim, kv_lim, off, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT,
                             HAS_SEG)
    s = tl.where(valid, s, float("-inf"))
  elif RUNTIME_MASK:
    if edge:
      valid = row_tile_visible(offs_m, kn, seg_q, kv_seg_base, q_lim, kv_lim, off, IS_CAUSAL, WINDOW_LEFT,
                               WINDOW_RIGHT, HAS_SEG)
      s = tl.where(valid, s, float("-inf"))
  m_new = tl.maximum(m, tl.max(s, axis=1))
  m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
  if QUANTIZE_P and P_ROW_RANGE > 0:
    # "row": the tile is R * exp(s - m) itself, log2(R) folded into the subtracted max, so l sums R * p and
    # O' takes bf16(R * p); one tile of probabilities stays live, as in block mode (a separate R * p tile
    # pushed this 255-register kernel into predicate packing, 40% slower).
    tl.static_assert(P_ROW_RANGE == 6.0 * 448.0, "LOG2_P_ROW_RANGE is log2(6 * 448)")
    p = tl.math.exp2(s - (m_safe - LOG2_P_ROW_RANGE)[:, None])  # exactly +0 where masked (s = -inf)
  else:
    p = tl.math.exp2(s - m_safe[:, None])  # exactly +0 where masked (s = -inf)
  alpha = tl.math.exp2(m - m_safe)
  l = l * alpha + tl.sum(p, axis=1)
  if EXACT:
    tl.static_assert(MASKED, "the exact tile applies the elementwise mask")
    nan_v = common.nan_of(v)
    v = tl.where(nan_v, tl.zeros_like(v), v)
  if not (O_ONLY and QUANTIZE_P):
    acc_hp = acc_hp * alpha[:, None] + bf16_dot(p, v, DOT_BF16, DOT_PREC, SOFT_BF16)

  if QUANTIZE_P:
    p_fq = fq_probs(p, BLOCK_M, BLOCK_N, HW_E4M3, HW_E2M1)  # exact in bf16 (E2M1 x E4M3)
    acc = acc * alpha[:, None] + bf16_dot(p_fq, v, DOT_BF16, DOT_PREC, SOFT_BF16)

  return acc, acc_hp, m_new, l


@triton.jit
def _fwd_program(
    q_ptr, k_ptr, v_ptr, scale, tq, tk, n_heads, group,
    q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr,
    o_ptr, o_hp_ptr, lse_ptr, m_ptr, strides,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr, HAS_SEG: tl.constexpr,
    QUANTIZE_Q: tl.constexpr, QUANTIZE_P: tl.constexpr, QK_F32: tl.constexpr, DOT_BF16: tl.constexpr,
    SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr,
    P_ROW_RANGE: tl.constexpr, QKV_TENSOR: tl.constexpr, SEQ_ALIGN: tl.constexpr, RESIDUALS: tl.constexpr,
    EXACT: tl.constexpr):
  """One program of ``attention_fwd_kernel``; EXACT: its exact walk (docs/NUMERICS.md, section 4, NaN): every tile
  masked, V's NaN read as 0, the results stored, then NaN stored where a visible pair meets a NaN of V. Otherwise
  the fast walks; returns whether a NaN reached a live row (with a mask that hides pairs: else False), i.e.
  whether the exact walk must follow. The exact walk recomputes everything from the arguments, so that nothing of
  it stays live across the fast walks (values kept for it pushed the fast loops into spills). strides: the kernel's
  12 strides, q's, k's, v's and o's, as a tuple (``program_start``)."""
  (strides, tq, tk, n_heads, group, pid_bh, b, h, kvh, start_m, offs_m, offs_n, offs_d, row_ok, q_lim, kv_lim, off,
   seg_q, kv_seg_base, stride_kt, stride_vt) = common.query_program_start(
       strides, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, BLOCK_M, BLOCK_N, D_PAD,
       IS_CAUSAL, BOTTOM_RIGHT, HAS_Q_LEN, HAS_KV_LEN, HAS_SEG, SEQ_ALIGN, SOFT_BF16, EXACT)
  d_ok = offs_d < HEAD_DIM

  q_ptrs = q_ptr + common.tile_rows(strides, 0, b, h, offs_m) + offs_d[None, :]
  q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
  if QKV_TENSOR:
    q_enc = tl.load(q_enc_ptr + pid_bh)
    if QUANTIZE_Q:  # else q holds fq(enc * Q) from the pass
      q = cast_fq(fq_tile(q.to(tl.float32) * q_enc, row_ok[:, None] & d_ok[None, :], BLOCK_M, D_PAD, HW_E4M3,
                          HW_E2M1), q.dtype, HW_E4M3)  # exact: E2M1 x E4M3 values fit the input dtype
  elif QUANTIZE_Q:
    q = cast_fq(fq_tile(q.to(tl.float32), row_ok[:, None] & d_ok[None, :], BLOCK_M, D_PAD, HW_E4M3, HW_E2M1),
                q.dtype, HW_E4M3)  # exact: fq values fit the input dtype
  k_base, v_base = common.kv_bases(k_ptr, v_ptr, strides, b, kvh)
  qk_scale = scale * LOG2E
  if QKV_TENSOR:
    kv_bh = b * (n_heads // group) + kvh
    # s = scale * (fq(enc_q Q) / enc_q) . (fq(enc_k K) / enc_k): the two decode scales join the softmax scale.
    qk_scale = scale * tl.div_rn(1.0, q_enc) * tl.div_rn(1.0, tl.load(k_enc_ptr + kv_bh)) * LOG2E

  m = tl.full([BLOCK_M], float("-inf"), tl.float32)
  l = tl.zeros([BLOCK_M], tl.float32)
  acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
  acc_hp = tl.zeros([BLOCK_M, D_PAD], tl.float32)

  # K/V tiles come by TMA at D_PAD = 128, and at 256 without segment ids: one copy per tile and no per-thread
  # addresses (the integer work that issued the K/V copies took about 12% of this kernel's stall samples,
  # docs/PERFORMANCE.md, section 3; this kernel 5-9% faster at D = 128 and 256). Below D_PAD = 128 and with
  # segment ids at 256 the tiles keep their loads (ptxas SIGSEGV at D = 16 and 32, the call slower at 64,
  # serialized wgmma with segment ids at 256). A window or segment ids walk most of their tiles masked: there every
  # walk takes the descriptors, bounded by kv_lim so that a ragged tail's rows come as zeros (the window's and the
  # packed documents' forward 3.5-6.5% faster); elsewhere only the unmasked loop does (descriptors on every walk
  # cost the causal and full forward 1.5-3%).
  USE_TMA: tl.constexpr = D_PAD == 128 or (D_PAD == 256 and not HAS_SEG)
  TMA_EVERY_WALK: tl.constexpr = USE_TMA and (WINDOW_LEFT >= 0 or HAS_SEG)
  k_desc = None
  v_desc = None
  if TMA_EVERY_WALK and not EXACT:  # a descriptor's bounds must be positive; no walk when kv_lim is 0
    k_desc, v_desc = kv_descriptors(k_base, v_base, tl.maximum(kv_lim, 1), stride_kt, stride_vt, HEAD_DIM, BLOCK_N,
                                    D_PAD)

  # In key order, as the reference walks them: tiles hidden from every row are skipped (they add nothing).
  lo, a, c, hi = kv_tile_range(start_m, q_lim, kv_lim, off, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
  if HAS_SEG:  # packed documents: only the keys of this block's segments; unmasked inside a lone segment
    lo, a, c, hi = narrow_to_segments(lo, a, c, hi, seg_q, offs_m < q_lim, kv_seg_base, kv_lim,
                                      tl.load(seg_sorted_ptr + b), BLOCK_N)
  # NaN at a masked pair. The walks multiply every pair of a tile, and a masked pair's p is exactly 0: a NaN of V
  # there adds 0 * NaN = NaN to a row that does not see it. Such a leak can only add a NaN, so a program whose live
  # rows end without one is exact as it is. Otherwise (a NaN input nearby) the exact walk follows
  # (``attention_fwd_kernel``): its tiles masked, V's NaN read as 0 (``EXACT``); it stores those results, then NaN
  # where a visible pair meets a NaN of V (a walk of ``nan_hits`` alone, so that no tile holds the NaN counts beside
  # its accumulators: that pressure serialized the kernel's wgmma). Where no NaN reaches them its results are the
  # fast walks' bit for bit.
  # Without a mask no pair is hidden (padding keys read as 0): nothing to check. Cost when there is no NaN: one
  # compare per element of an accumulator and a reduction, once per program.
  HIDES: tl.constexpr = IS_CAUSAL or WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0 or HAS_SEG or HAS_Q_LEN or HAS_KV_LEN
  v_dec = 1.0
  if QKV_TENSOR:  # O and O' are sums of p @ fq(enc_v V): V's decode scale 1 / enc_v joins the normalization
    v_dec = tl.div_rn(1.0, tl.load(v_enc_ptr + kv_bh))
  leaked = False
  if EXACT:
    for i in range(0, hi - lo, BLOCK_N):
      acc, acc_hp, m, l = _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, lo + i, offs_m, offs_n, offs_d, seg_q,
                                   kv_seg_base, q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, True, HEAD_DIM,
                                   IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P, BLOCK_M, BLOCK_N,
                                   QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE,
                                   O_ONLY=not RESIDUALS, EXACT=True)
    _store_outputs(acc, acc_hp, m, l, v_dec, offs_m, offs_d, row_ok, d_ok, q_lim, b, h, pid_bh, tq, strides, o_ptr,
                   o_hp_ptr, lse_ptr, m_ptr, QUANTIZE_P, P_ROW_RANGE, QKV_TENSOR, SOFT_BF16, RESIDUALS)
    # NaN where a visible pair meets a NaN of V, 16 channels at a time: a [BLOCK_M, D] count beside the walk's other
    # values spilled the capped O-only kernel's fast loops.
    for c0 in range(0, D_PAD, NAN_CHANNELS):
      offs_c = c0 + tl.arange(0, NAN_CHANNELS)
      hits = common.key_nan_hits(v_base, stride_vt, offs_c, lo, hi, offs_m, offs_n, seg_q, kv_seg_base, q_lim, kv_lim,
                                 off, HEAD_DIM, BLOCK_M, BLOCK_N, NAN_CHANNELS, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT,
                                 HAS_SEG, DOT_BF16, DOT_PREC)
      c_off = common.tile_rows(strides, 3, b, h, offs_m) + offs_c[None, :]
      c_ok = row_ok[:, None] & (offs_c[None, :] < HEAD_DIM) & (hits > 0.0)
      nan_out = tl.full([BLOCK_M, NAN_CHANNELS], float("nan"), tl.float32)
      if RESIDUALS:
        tl.store(o_hp_ptr + c_off, cast_out(nan_out, o_hp_ptr, SOFT_BF16), mask=c_ok)
      tl.store(o_ptr + c_off, cast_out(nan_out, o_ptr, SOFT_BF16), mask=c_ok)
  else:
    if WINDOW_LEFT >= 0:
      # A window: one pipelined walk over [lo, hi), the mask applied under a runtime branch on the edge tiles. Its
      # programs are short (17 tiles at 1024 keys); three loops filled and drained the K/V pipeline three times
      # each: this walk is 6% faster. Numerics: as in every walk, the scores are rounded once before the max
      # subtraction (``mul_rn``; docs/NUMERICS.md, section 8).
      for i in range(0, hi - lo, BLOCK_N):
        acc, acc_hp, m, l = _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, lo + i, offs_m, offs_n, offs_d, seg_q,
                                     kv_seg_base, q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, False, HEAD_DIM,
                                     IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P, BLOCK_M, BLOCK_N,
                                     QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE, True,
                                     (lo + i < a) | (lo + i >= c), k_desc, v_desc, TMA_EVERY_WALK, not RESIDUALS)
    else:
      # The first walk counts from 0: written as range(lo, a), with the window's lo, ptxas serialized every wgmma
      # of the kernel ("non wgmma instructions defining accumulator registers"; the window's forward ran 5% slower).
      for i in range(0, a - lo, BLOCK_N):
        acc, acc_hp, m, l = _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, lo + i, offs_m, offs_n, offs_d, seg_q,
                                     kv_seg_base, q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, True, HEAD_DIM,
                                     IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P, BLOCK_M, BLOCK_N,
                                     QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE,
                                     k_desc=k_desc, v_desc=v_desc, USE_TMA=TMA_EVERY_WALK, O_ONLY=not RESIDUALS)
      mid_k = k_desc
      mid_v = v_desc
      if USE_TMA and not TMA_EVERY_WALK:  # made here, after the first walk: the order in which they were measured
        mid_k, mid_v = kv_descriptors(k_base, v_base, tk, stride_kt, stride_vt, HEAD_DIM, BLOCK_N, D_PAD)
      for start_n in range(a, c, BLOCK_N):
        acc, acc_hp, m, l = _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, seg_q,
                                     kv_seg_base, q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, False, HEAD_DIM,
                                     IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P, BLOCK_M, BLOCK_N,
                                     QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE, False, False,
                                     mid_k, mid_v, USE_TMA, not RESIDUALS)
      for start_n in range(c, hi, BLOCK_N):
        acc, acc_hp, m, l = _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, seg_q,
                                     kv_seg_base, q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, True, HEAD_DIM,
                                     IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P, BLOCK_M, BLOCK_N,
                                     QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE,
                                     k_desc=k_desc, v_desc=v_desc, USE_TMA=TMA_EVERY_WALK, O_ONLY=not RESIDUALS)

    if HIDES:
      checked = acc_hp
      if QUANTIZE_P and not RESIDUALS:  # O alone: O' was not formed (a leak reaches both alike)
        checked = acc
      leaked = common.any_nan(checked, offs_m < q_lim)
    if leaked == 0:  # else the exact walk stores
      _store_outputs(acc, acc_hp, m, l, v_dec, offs_m, offs_d, row_ok, d_ok, q_lim, b, h, pid_bh, tq, strides,
                     o_ptr, o_hp_ptr, lse_ptr, m_ptr, QUANTIZE_P, P_ROW_RANGE, QKV_TENSOR, SOFT_BF16, RESIDUALS)
  return leaked


@triton.jit
def _store_outputs(acc, acc_hp, m, l, v_dec, offs_m, offs_d, row_ok, d_ok, q_lim, b, h, pid_bh, tq, strides, o_ptr,
                   o_hp_ptr, lse_ptr, m_ptr, QUANTIZE_P: tl.constexpr, P_ROW_RANGE: tl.constexpr,
                   QKV_TENSOR: tl.constexpr, SOFT_BF16: tl.constexpr, RESIDUALS: tl.constexpr):
  """The forward's epilogue: normalizes and stores O (and with RESIDUALS O', lse and, in row mode, m) of this
  program's rows; returns the outputs' offsets and store mask."""
  # No visible key (or a padded query row, which the unmasked tiles do not hide): O = O' = 0, lse = -inf.
  empty = (l == 0.0) | (offs_m >= q_lim)
  inv = tl.where(empty, 0.0, tl.div_rn(1.0, tl.where(empty, 1.0, l)))
  acc_hp = tl.where(empty[:, None], 0.0, acc_hp)  # +0, not acc * 0 (-0 for a padded row's negative sums)
  acc = tl.where(empty[:, None], 0.0, acc)
  if QKV_TENSOR:  # V's decode scale 1 / enc_v (``v_dec``) joins the normalization
    inv = inv * v_dec
  log_l = tl.math.log2(tl.where(empty, 1.0, l))
  if QUANTIZE_P and P_ROW_RANGE > 0:  # l sums R * p here: 1 / l is already 1 / (R * sum p)
    log_l = log_l - LOG2_P_ROW_RANGE
  lse = tl.where(empty, float("-inf"), (m + log_l) * LN2)
  o_off = common.tile_rows(strides, 3, b, h, offs_m) + offs_d[None, :]
  out_ok = row_ok[:, None] & d_ok[None, :]
  hp_ptr = o_ptr  # O' in O's dtype (o_hp_ptr is None without RESIDUALS)
  if RESIDUALS:
    hp_ptr = o_hp_ptr
  out_hp = cast_out(acc_hp * inv[:, None], hp_ptr, SOFT_BF16)
  if RESIDUALS:
    tl.store(o_hp_ptr + o_off, out_hp, mask=out_ok)
  if QUANTIZE_P:
    tl.store(o_ptr + o_off, cast_out(acc * inv[:, None], o_ptr, SOFT_BF16), mask=out_ok)
  else:
    tl.store(o_ptr + o_off, out_hp, mask=out_ok)  # bf16(p) on both paths: O = O'
  if RESIDUALS:
    tl.store(lse_ptr + pid_bh.to(tl.int64) * tq + offs_m, lse, mask=row_ok)
  if RESIDUALS and P_ROW_RANGE > 0:
    # A NaN score reaches the row max as it reaches lse: the compiled max drops a NaN operand, its l does not.
    row_max = tl.where(lse != lse, lse, m * LN2)
    tl.store(m_ptr + pid_bh.to(tl.int64) * tq + offs_m, tl.where(empty, float("-inf"), row_max), mask=row_ok)
  return o_off, out_ok


@triton.jit
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, scale, tq, tk, n_heads, group,
    q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr, leak_ptr,
    stride_qb, stride_qt, stride_qn, stride_kb, stride_kt, stride_kn, stride_vb, stride_vt, stride_vn,
    stride_ob, stride_ot, stride_on,
    o_ptr, o_hp_ptr, lse_ptr, m_ptr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr, HAS_SEG: tl.constexpr,
    QUANTIZE_Q: tl.constexpr, QUANTIZE_P: tl.constexpr, QK_F32: tl.constexpr, DOT_BF16: tl.constexpr,
    SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr,
    P_ROW_RANGE: tl.constexpr, QKV_TENSOR: tl.constexpr, SEQ_ALIGN: tl.constexpr, RESIDUALS: tl.constexpr,
    REDO: tl.constexpr = False):
  """Forward of docs/NUMERICS.md, section 4, for query rows [i * BLOCK_M, +BLOCK_M) of head j % N, batch j // N, where
  ``(i, j) = program_tile(...)``. The one entry point of the forward: the flags below pick what it reads and
  writes; an operand it does not read is a placeholder (any buffer), an output it does not write is None (a
  constexpr: that variant compiles without it).

  q: [B, Tq, N, D]; k, v: [B, Tk, K, D] (already fq when QUANTIZE_QKV), N = K * group;
  the last axis of every array is contiguous; D = HEAD_DIM, tiles padded to D_PAD (a power of two) with
  masked loads. Masks (each read only under its flag; any pointer otherwise): q_len, kv_len [B] int32,
  q_seg [B, Tq], kv_seg [B, Tk] int32 dense, seg_sorted [B] int32 (``segments_sorted_kernel``);
  IS_CAUSAL, WINDOW_LEFT/RIGHT (-1: none) and BOTTOM_RIGHT as in ``attention_common.visible``.
  Outputs: o, o_hp [B, Tq, N, D] (strides stride_o*), lse [B, N, Tq] fp32 contiguous.
  Grid: (cdiv(Tq, BLOCK_M), B * N), handed out longest walk first when causal (``program_tile``).
  Flags: ``dot_flags`` and ``nvfp4.quant_flags``; SEQ_ALIGN as in ``attention_common.aligned_lengths``.
  P_ROW_RANGE: 0 ("block"), or R > 0 ("row": fq(R p), O = acc / (R l), and m [B, N, Tq] fp32 (natural
  units, -inf for an empty row) stored through ``m_ptr``, which is None otherwise).
  QKV_TENSOR (qkv_scale="tensor"): k, v hold fq(enc * K), fq(enc * V) (``fake_quantize_scaled_kernel``) and
  q_enc [B, N], k_enc, v_enc [B, K] fp32 (``tensor_scale_kernel``) the encode scales; Q is quantized here as
  fq(enc * Q) (QUANTIZE_Q; else q holds it, from the same pass as K and V), the decode scales 1 / enc of Q and K
  are folded into the softmax scale and V's into the final normalization (FP32 rounding only, docs/NUMERICS.md).
  The enc pointers are placeholders otherwise.
  RESIDUALS off (the primal of ``jqat.attention``, where nothing differentiates): only o is stored (o_hp_ptr,
  lse_ptr and m_ptr are None), and with QUANTIZE_P the O' accumulator and its P V_hat product are dropped; O's
  arithmetic is the same, so are its bits.
  REDO: after the warp-specialized causal walk (``attention_fwd_ws``, whose walk computes this kernel's fast walk's
  values): only the exact walk, and only where ``leak_ptr`` ([B * N, cdiv(Tq, BLOCK_M)] int32, this launch's grid)
  flags that a NaN reached the row tile's outputs there (that launch then stored none of its O and O'). Not read
  otherwise (any pointer).
  """
  strides = (stride_qb, stride_qt, stride_qn, stride_kb, stride_kt, stride_kn, stride_vb, stride_vt, stride_vn,
             stride_ob, stride_ot, stride_on)
  if REDO:  # the fast walk was the warp-specialized kernel's: its flag says whether a NaN reached it
    pid_t, pid_bh = common.program_tile(IS_CAUSAL, True)
    leaked = tl.load(leak_ptr + pid_bh * tl.num_programs(0) + pid_t) != 0
  else:
    leaked = _fwd_program(
        q_ptr, k_ptr, v_ptr, scale, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr,
        seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr, o_ptr, o_hp_ptr, lse_ptr, m_ptr, strides, HEAD_DIM, D_PAD,
        BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, BOTTOM_RIGHT, HAS_Q_LEN, HAS_KV_LEN, HAS_SEG,
        QUANTIZE_Q, QUANTIZE_P, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE, QKV_TENSOR,
        SEQ_ALIGN, RESIDUALS, False)
  HIDES: tl.constexpr = IS_CAUSAL or WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0 or HAS_SEG or HAS_Q_LEN or HAS_KV_LEN
  if HIDES:
    if leaked:  # a NaN reached a live row: the exact walk (_fwd_program)
      _fwd_program(q_ptr, k_ptr, v_ptr, scale, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr,
                   seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr, o_ptr, o_hp_ptr, lse_ptr, m_ptr, strides, HEAD_DIM,
                   D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, BOTTOM_RIGHT, HAS_Q_LEN, HAS_KV_LEN,
                   HAS_SEG, QUANTIZE_Q, QUANTIZE_P, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1,
                   P_ROW_RANGE, QKV_TENSOR, SEQ_ALIGN, RESIDUALS, True)
