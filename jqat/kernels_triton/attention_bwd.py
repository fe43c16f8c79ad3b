"""NVFP4 QAT attention backward (docs/NUMERICS.md, section 5) as Triton kernels, deterministic (no atomics).

Given fq(Q), fq(K), fq(V) (written once by ``fake_quantize_kernel``), dO, lse
and ``delta = rowsum(O_for_delta * dO)`` (``attention_bwd_delta_kernel``):

    P  = exp(scale * Qh @ Kh^T - lse)      0 where masked or lse = -inf
    dS = P * (dO @ Vh^T - delta)
    dQ = scale * bf16(dS) @ Kh                                   (dQ kernel)
    dK = scale * bf16(dS)^T @ Qh,  dV = fq(P)^T @ dO             (dK/dV kernel)

With ``p_scale="row"`` (``P_ROW_RANGE`` = R = 6 * 448, docs/NUMERICS.md) the dK/dV kernel
uses bf16(fq(R * exp(S - m)) * (1 / (R * l))), l = exp(lse - m) with m the forward's row max, in place of fq(P)
for dV; dS keeps P. ``attention_bwd_row_factors_kernel`` forms R * l and 1 / (R * l) once per query row.

With ``qkv_scale="tensor"`` (``QKV_TENSOR``; the encode scales are placeholders otherwise) fq(Q), fq(K), fq(V)
are fq(enc * X), one FP32 encode scale per (batch, head) (``nvfp4.tensor_scale_kernel``); the decode scales
1 / enc join the softmax scale (Q, K), dO . V^T (V), dQ's scale (K) and each query head's dK contribution (Q).

The dK/dV program of one KV head loops over the query heads that share it
(GQA), so dK and dV are reduced in a fixed order inside one program. It holds
P transposed, ``[keys, queries]``: fq(P) runs along keys, i.e. along axis 0 of
that tile, in blocks of 16 at absolute key indices (key tiles start at
multiples of BLOCK_N, a multiple of 16).
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from jqat.kernels_triton import attention_common as common
from jqat.kernels_triton.attention_common import (
  LOG2E,
  aligned3,
  bf16_dot,
  cast_out,
  kv_tile_range,
  load_kv_tile,
  narrow_to_segments,
  program_start,
  q_tile_range,
  qk_dot,
  row_tile_visible,
  visible,
)
from jqat.kernels_triton.nvfp4 import cast_fq, fq_probs_t, fq_tile


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
  """Launch configuration of the dQ kernel (``dq_*``) and the dK/dV kernel (``kv_*``).

  The dQ program keeps a tall Q/dO tile (``dq_block_m`` rows) and streams thin K/V tiles
  (``dq_block_n`` keys); the dK/dV program keeps ``kv_block_n`` keys and streams ``kv_block_m``
  query rows. Block sizes are powers of two, ``kv_block_n % 16 == 0`` (fq(P) blocks along keys).
  """

  dq_block_m: int
  dq_block_n: int
  dq_num_warps: int
  dq_num_stages: int
  kv_block_n: int
  kv_block_m: int
  kv_num_warps: int
  kv_num_stages: int


# By head dim, the fastest of the H200 sweeps (benchmarks/attention_sweep.py; docs/PERFORMANCE.md, section 4).
BACKWARD_CONFIGS = {64: BackwardConfig(128, 32, 4, 3, 128, 32, 4, 3), 128: BackwardConfig(128, 64, 8, 3, 64, 32, 4, 3),
                    256: BackwardConfig(64, 32, 8, 2, 64, 32, 8, 2)}


def backward_config(head_dim: int, windowed: bool = False) -> BackwardConfig:
  """The default :class:`BackwardConfig` for head dim ``head_dim`` (a multiple of 16); ``windowed``: with a
  ``local_window_size``, whose dQ programs walk a window's key tiles only."""
  config = BACKWARD_CONFIGS[min((d for d in BACKWARD_CONFIGS if d >= head_dim), default=256)]
  if windowed and config is BACKWARD_CONFIGS[128]:
    # A window of 1024 at 16k: 64 query rows on 4 warps, 2 stages, walk 17 key tiles of 64 instead of 128 rows' 18,
    # with fewer masked: the dQ kernel 7% faster on the H200. Without a window the 128-row program stays: the 64-row
    # one was 8-18% slower there.
    config = dataclasses.replace(config, dq_block_m=64, dq_num_warps=4, dq_num_stages=2)
  return config


# Launch parameters of the delta kernel (grid: (cdiv(Tq, BLOCK_M), B * N)).
DELTA_LAUNCH = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 1}
ROW_FACTORS_LAUNCH = {"BLOCK": 1024, "num_warps": 4, "num_stages": 1}


NAN_CHANNELS = tl.constexpr(16)  # channels per step of the exact walks' NaN passes (attention_fwd.NAN_CHANNELS)


@triton.jit
def _delta_block(o_ptr, do_ptr, tq, n_heads, stride_ob, stride_ot, stride_on, stride_db, stride_dt, stride_dn,
                 delta_ptr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
  """Stores ``delta = sum_d O * dO`` (FP32) of this program's BLOCK_M query rows; returns its batch and head."""
  stride_ob, stride_ot, stride_on = aligned3(stride_ob, stride_ot, stride_on)
  stride_db, stride_dt, stride_dn = aligned3(stride_db, stride_dt, stride_dn)
  pid_bh = tl.program_id(1)
  b = pid_bh // n_heads
  h = pid_bh % n_heads
  offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_d = tl.arange(0, D_PAD)
  row_ok = offs_m < tq
  ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
  rows = offs_m.to(tl.int64)[:, None]
  o = tl.load(o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_on + rows * stride_ot + offs_d[None, :],
              mask=ok, other=0.0).to(tl.float32)
  do = tl.load(do_ptr + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dn + rows * stride_dt + offs_d[None, :],
               mask=ok, other=0.0).to(tl.float32)
  tl.store(delta_ptr + pid_bh.to(tl.int64) * tq + offs_m, tl.sum(o * do, axis=1), mask=row_ok)
  return b, h


@triton.jit
def attention_bwd_delta_kernel(o_ptr, do_ptr, tq, n_heads, stride_ob, stride_ot, stride_on, stride_db, stride_dt,
                               stride_dn, delta_ptr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                               BLOCK_M: tl.constexpr):
  """``delta[b, n, i] = sum_d O[b, i, n, d] * dO[b, i, n, d]`` in FP32; delta: [B, N, Tq] contiguous.

  D = HEAD_DIM, read in tiles of D_PAD (a power of two) channels. Grid: (cdiv(Tq, BLOCK_M), B * N).
  """
  _delta_block(o_ptr, do_ptr, tq, n_heads, stride_ob, stride_ot, stride_on, stride_db, stride_dt, stride_dn,
               delta_ptr, HEAD_DIM, D_PAD, BLOCK_M)


@triton.jit
def attention_bwd_delta_fq_kernel(o_ptr, do_ptr, q_ptr, tq, n_heads, stride_ob, stride_ot, stride_on, stride_db,
                                  stride_dt, stride_dn, stride_qb, stride_qt, stride_qn, delta_ptr, q_hat_ptr,
                                  HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                                  HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """``attention_bwd_delta_kernel`` that also writes fq(Q) (blocks of 16 along D) to ``q_hat`` (Q's strides).

  ``q_hat`` may be O's own storage (the JAX binding aliases them: O is dead once delta is formed, and
  fq(Q) then needs no buffer of its own at the backward's peak): each program reads its rows of O
  before it writes the same rows of fq(Q), and no program touches another's rows.
  q: [B, Tq, N, D] with the shape of O. Grid: (cdiv(Tq, BLOCK_M), B * N).
  """
  # delta exactly as attention_bwd_delta_kernel forms it (same tile and layout: the torch binding, which keeps
  # that kernel, gets the same bits), then fq(Q) in slices of 4096 elements: a whole tile at once needs three
  # times the registers.
  b, h = _delta_block(o_ptr, do_ptr, tq, n_heads, stride_ob, stride_ot, stride_on, stride_db, stride_dt, stride_dn,
                      delta_ptr, HEAD_DIM, D_PAD, BLOCK_M)
  offs_d = tl.arange(0, D_PAD)
  stride_qb, stride_qt, stride_qn = aligned3(stride_qb, stride_qt, stride_qn)
  FQ_ROWS: tl.constexpr = min(BLOCK_M, 4096 // D_PAD)
  for i in tl.static_range(BLOCK_M // FQ_ROWS):
    rows = tl.program_id(0) * BLOCK_M + i * FQ_ROWS + tl.arange(0, FQ_ROWS)
    ok = (rows < tq)[:, None] & (offs_d[None, :] < HEAD_DIM)
    q_off = (b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qn + rows.to(tl.int64)[:, None] * stride_qt
             + offs_d[None, :])
    q = tl.load(q_ptr + q_off, mask=ok, other=0.0)
    q_hat = fq_tile(q.to(tl.float32), ok, FQ_ROWS, D_PAD, HW_E4M3, HW_E2M1)
    tl.store(q_hat_ptr + q_off, cast_fq(q_hat, q_hat_ptr.dtype.element_ty, HW_E4M3), mask=ok)


@triton.jit
def attention_bwd_row_factors_kernel(lse_ptr, m_ptr, rows, tq, rf_ptr, P_ROW_RANGE: tl.constexpr,
                                     BLOCK: tl.constexpr):
  """``p_scale="row"``: per query row, ``R * l`` and ``1 / (R * l)`` with ``l = exp(lse - m)`` (m the forward's row
  max), into ``rf [B, N, 2, Tq]`` fp32 (``rf[b, n, 0]`` the first, ``rf[b, n, 1]`` the second); a row without keys
  (lse = -inf) gets 1 and 0. lse, m: ``[B, N, Tq]`` dense, ``rows = B * N * Tq``. Grid: ``cdiv(rows, BLOCK)``.

  The dK/dV kernel forms ``R * exp(S - m)`` as ``p * (R * l)`` (one product per probability; the rounding of lse
  cancels between p and l) and scales fq of it by ``1 / (R * l)``. Formed there, the exp2 and the division ran for
  every query row of every query tile in each key tile's program (and spilled registers); here once per row."""
  i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
  ok = i < rows
  lse = tl.load(lse_ptr + i, mask=ok, other=float("-inf"))
  m = tl.load(m_ptr + i, mask=ok, other=float("-inf"))
  empty = lse == float("-inf")
  lse2 = tl.where(empty, float("inf"), lse * LOG2E)
  rl = tl.where(empty, 1.0, tl.math.exp2(lse2 - m * LOG2E) * P_ROW_RANGE)
  inv_rl = tl.where(empty, 0.0, tl.div_rn(1.0, rl))
  at = rf_ptr + (i // tq) * (2 * tq) + i % tq
  tl.store(at, rl, mask=ok)
  tl.store(at + tq, inv_rl, mask=ok)


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_n, offs_d, seg_q, kv_seg_base, q_lim,
             kv_lim, off, stride_kt, stride_vt, qk_scale, v_dec, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr,
             IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_SEG: tl.constexpr,
             QK_F32: tl.constexpr, DOT_BF16: tl.constexpr, SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr,
             QKV_TENSOR: tl.constexpr, RUNTIME_MASK: tl.constexpr = False, edge=False, EXACT: tl.constexpr = False):
  """One KV tile's contribution to dQ. EXACT (with MASKED): the exact walk's tile: dS is 0 at masked pairs (not
  0 * NaN of dO . V^T or delta) and K's NaN is read as 0 in dS K (the walk's caller sets the NaN of visible pairs)."""
  kn = start_n + offs_n
  k, v = load_kv_tile(k_base, v_base, start_n, offs_n, offs_d, kv_lim, stride_kt, stride_vt, HEAD_DIM,
                      MASKED or RUNTIME_MASK)
  p = tl.math.exp2(qk_dot(q, k, QK_F32, DOT_PREC) * qk_scale - lse2[:, None])
  if MASKED:
    valid = row_tile_visible(offs_m, kn, seg_q, kv_seg_base, q_lim, kv_lim, off, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT,
                             HAS_SEG)
    p = tl.where(valid, p, 0.0)
  elif RUNTIME_MASK:
    if edge:
      valid = row_tile_visible(offs_m, kn, seg_q, kv_seg_base, q_lim, kv_lim, off, IS_CAUSAL, WINDOW_LEFT,
                               WINDOW_RIGHT, HAS_SEG)
      p = tl.where(valid, p, 0.0)
  dp = qk_dot(do, v, QK_F32, DOT_PREC)
  if QKV_TENSOR:  # v holds fq(enc_v V): dO . V_hat^T is v_dec times the product
    dp = dp * v_dec
  ds = p * (dp - delta[:, None])
  if EXACT:
    tl.static_assert(MASKED, "the exact tile applies the elementwise mask")
    ds = tl.where(valid, ds, 0.0)
    k = tl.where(common.nan_of(k), tl.zeros_like(k), k)
  return dq + bf16_dot(ds, k, DOT_BF16, DOT_PREC, SOFT_BF16)


@triton.jit
def _dq_program(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, scale, tq, tk, n_heads, group,
    q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr,
    dq_ptr, strides,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr, HAS_SEG: tl.constexpr,
    QK_F32: tl.constexpr, DOT_BF16: tl.constexpr, SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr,
    QKV_TENSOR: tl.constexpr, SEQ_ALIGN: tl.constexpr, EXACT: tl.constexpr = False):
  """One program of ``attention_bwd_dq_kernel``; EXACT: its exact walk (every tile masked, dS = 0 at masked pairs,
  K's NaN read as 0; stores, then NaN where a visible pair meets a NaN of K). Otherwise the fast walks; returns
  whether a NaN reached dQ (with a mask that hides pairs: else False). As in the forward (``_fwd_program``) the
  exact walk recomputes everything from the arguments; strides: the kernel's 12, q's, k's, v's and do's, as a tuple
  (``program_start``)."""
  (strides, tq, tk, n_heads, group, pid_bh, b, h, kvh, start_m, offs_m, offs_n, offs_d, row_ok, q_lim, kv_lim, off,
   seg_q, kv_seg_base, stride_kt, stride_vt) = common.query_program_start(
       strides, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, BLOCK_M, BLOCK_N, D_PAD,
       IS_CAUSAL, BOTTOM_RIGHT, HAS_Q_LEN, HAS_KV_LEN, HAS_SEG, SEQ_ALIGN, SOFT_BF16, EXACT)
  ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
  q_rows = common.tile_rows(strides, 0, b, h, offs_m)
  q_off = q_rows + offs_d[None, :]
  q = tl.load(q_ptr + q_off, mask=ok, other=0.0)
  do = tl.load(do_ptr + common.tile_rows(strides, 3, b, h, offs_m) + offs_d[None, :], mask=ok, other=0.0)
  # Padded query rows read lse = -inf: the unmasked tiles do not hide them, a zero P does.
  lse = tl.load(lse_ptr + pid_bh.to(tl.int64) * tq + offs_m, mask=offs_m < q_lim, other=float("-inf"))
  delta = tl.load(delta_ptr + pid_bh.to(tl.int64) * tq + offs_m, mask=row_ok, other=0.0)
  # In log2 units; +inf for a row without visible keys (or a padding row) makes its P exactly 0.
  lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
  qk_scale = scale * LOG2E
  dq_scale = scale
  v_dec = 1.0  # V's decode scale: qkv_scale="tensor" only
  if QKV_TENSOR:
    kv_bh = b * (n_heads // group) + kvh
    k_dec = tl.div_rn(1.0, tl.load(k_enc_ptr + kv_bh))
    qk_scale = scale * tl.div_rn(1.0, tl.load(q_enc_ptr + pid_bh)) * k_dec * LOG2E
    dq_scale = scale * k_dec
    v_dec = tl.div_rn(1.0, tl.load(v_enc_ptr + kv_bh))
  k_base, v_base = common.kv_bases(k_ptr, v_ptr, strides, b, kvh)

  dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
  # The forward's tiling: [lo, a) and [c, hi) masked, [a, c) unmasked, the rest hidden and skipped.
  lo, a, c, hi = kv_tile_range(start_m, q_lim, kv_lim, off, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
  if HAS_SEG:  # packed documents: only the keys of this block's segments; unmasked inside a lone segment
    lo, a, c, hi = narrow_to_segments(lo, a, c, hi, seg_q, offs_m < q_lim, kv_seg_base, kv_lim,
                                      tl.load(seg_sorted_ptr + b), BLOCK_N)
  # NaN at a masked pair (see the forward's exact walk): dS = 0 * NaN where dO . V^T or delta is NaN, a K row's NaN
  # times a masked pair's dS = 0, and padded query rows (lse = -inf), which the unmasked tiles do not hide, are all
  # leaks that can only add a NaN. A program whose rows end without one is exact; otherwise the exact walk follows
  # (padded rows get exact zeros). Once per program when there is no NaN: one compare per element of dQ and a
  # reduction.
  HIDES: tl.constexpr = IS_CAUSAL or WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0 or HAS_SEG or HAS_Q_LEN or HAS_KV_LEN
  leaked = False
  if EXACT:
    for i in range(0, hi - lo, BLOCK_N):
      dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, lo + i, offs_m, offs_n, offs_d, seg_q, kv_seg_base, q_lim,
                    kv_lim, off, stride_kt, stride_vt, qk_scale, v_dec, True, HEAD_DIM, IS_CAUSAL, WINDOW_LEFT,
                    WINDOW_RIGHT, HAS_SEG, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, QKV_TENSOR, EXACT=True)
    tl.store(dq_ptr + q_off, cast_out(dq * dq_scale, dq_ptr, SOFT_BF16), mask=ok)
    for c0 in range(0, D_PAD, NAN_CHANNELS):  # NaN where a visible pair meets a NaN of K, 16 channels at a time
      offs_c = c0 + tl.arange(0, NAN_CHANNELS)
      hits = common.key_nan_hits(k_base, stride_kt, offs_c, lo, hi, offs_m, offs_n, seg_q, kv_seg_base, q_lim, kv_lim,
                                 off, HEAD_DIM, BLOCK_M, BLOCK_N, NAN_CHANNELS, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT,
                                 HAS_SEG, DOT_BF16, DOT_PREC)
      c_off = q_rows + offs_c[None, :]
      tl.store(dq_ptr + c_off, cast_out(tl.full([BLOCK_M, NAN_CHANNELS], float("nan"), tl.float32), dq_ptr,
                                        SOFT_BF16), mask=row_ok[:, None] & (offs_c[None, :] < HEAD_DIM) & (hits > 0.0))
  else:
    # A window: one pipelined walk, the mask under a runtime branch, as in the forward; above D_PAD = 128 that walk
    # made ptxas serialize every wgmma of the kernel, so wide heads take the three walks (that kernel measured 12%
    # faster at D = 192 and 256 on the H200, the same bits).
    if WINDOW_LEFT >= 0 and D_PAD <= 128:
      for i in range(0, hi - lo, BLOCK_N):
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, lo + i, offs_m, offs_n, offs_d, seg_q, kv_seg_base,
                      q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, v_dec, False, HEAD_DIM, IS_CAUSAL,
                      WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, QKV_TENSOR, True,
                      (lo + i < a) | (lo + i >= c))
    else:
      for i in range(0, a - lo, BLOCK_N):  # from 0, as the forward's first walk (ptxas serialized range(lo, a))
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, lo + i, offs_m, offs_n, offs_d, seg_q, kv_seg_base,
                      q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, v_dec, True, HEAD_DIM, IS_CAUSAL,
                      WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, QKV_TENSOR)
      for start_n in range(a, c, BLOCK_N):
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_n, offs_d, seg_q, kv_seg_base,
                      q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, v_dec, False, HEAD_DIM, IS_CAUSAL,
                      WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, QKV_TENSOR)
      for start_n in range(c, hi, BLOCK_N):
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_n, offs_d, seg_q, kv_seg_base,
                      q_lim, kv_lim, off, stride_kt, stride_vt, qk_scale, v_dec, True, HEAD_DIM, IS_CAUSAL,
                      WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, QKV_TENSOR)
    if HIDES:
      leaked = common.any_nan(dq, row_ok)
    if leaked == 0:  # else the exact walk stores
      tl.store(dq_ptr + q_off, cast_out(dq * dq_scale, dq_ptr, SOFT_BF16), mask=ok)
  return leaked


@triton.jit
def attention_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, scale, tq, tk, n_heads, group,
    q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr,
    stride_qb, stride_qt, stride_qn, stride_kb, stride_kt, stride_kn, stride_vb, stride_vt, stride_vn,
    stride_db, stride_dt, stride_dn,
    dq_ptr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr, HAS_SEG: tl.constexpr,
    QK_F32: tl.constexpr, DOT_BF16: tl.constexpr, SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr,
    QKV_TENSOR: tl.constexpr, SEQ_ALIGN: tl.constexpr):
  """dQ for query rows [i * BLOCK_M, +BLOCK_M) of head j % N, batch j // N, ``(i, j) = program_tile(...)``.

  q: fq(Q) [B, Tq, N, D] (strides stride_q*, shared by dq); k, v: fq(K), fq(V)
  [B, Tk, K, D]; do: [B, Tq, N, D] (strides stride_d*); lse, delta: [B, N, Tq]
  fp32 contiguous. D and the masks (seg_sorted included) as in ``attention_fwd_kernel``.
  QKV_TENSOR: q, k, v hold fq(enc * X) and q_enc [B, N], k_enc, v_enc [B, K] fp32 their encode scales (read
  only then: placeholders, any buffer, otherwise); the decode scales 1 / enc join the softmax scale (Q, K),
  dO . V^T (V) and dQ's scale (K).
  Grid: (cdiv(Tq, BLOCK_M), B * N), longest walk first when causal (``program_tile``). SEQ_ALIGN as in
  ``attention_common.aligned_lengths``.
  """
  strides = (stride_qb, stride_qt, stride_qn, stride_kb, stride_kt, stride_kn, stride_vb, stride_vt, stride_vn,
             stride_db, stride_dt, stride_dn)
  leaked = _dq_program(
      q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, scale, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr,
      q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr, dq_ptr, strides, HEAD_DIM, D_PAD,
      BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, BOTTOM_RIGHT, HAS_Q_LEN, HAS_KV_LEN, HAS_SEG, QK_F32,
      DOT_BF16, SOFT_BF16, DOT_PREC, QKV_TENSOR, SEQ_ALIGN, EXACT=False)
  HIDES: tl.constexpr = IS_CAUSAL or WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0 or HAS_SEG or HAS_Q_LEN or HAS_KV_LEN
  if HIDES:
    if leaked:  # a NaN reached dQ: the exact walk (_dq_program)
      _dq_program(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, scale, tq, tk, n_heads, group, q_len_ptr,
                  kv_len_ptr, q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr, dq_ptr, strides,
                  HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, BOTTOM_RIGHT, HAS_Q_LEN,
                  HAS_KV_LEN, HAS_SEG, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, QKV_TENSOR, SEQ_ALIGN, EXACT=True)

@triton.jit
def _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, rf_base, start_m, kn, offs_m, offs_d, seg_k,
               q_seg_base, q_lim, kv_lim, off, tq, stride_qt, stride_dt, qk_scale, q_dec, v_dec, MASKED: tl.constexpr,
               HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
               HAS_SEG: tl.constexpr, QUANTIZE_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               QK_F32: tl.constexpr, DOT_BF16: tl.constexpr, SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr,
               HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr, P_ROW_RANGE: tl.constexpr, QKV_TENSOR: tl.constexpr,
               EXACT: tl.constexpr = False):
  """One query tile's contribution to dK, dV of the key tile ``kn``; P held as [keys, queries].

  q_dec, v_dec: the decode scales of this query head's Q and of V (QKV_TENSOR only).
  EXACT (with MASKED): the exact walk's tile: dS and fq(P) are 0 at masked pairs (not 0 * NaN, and not NaN from a
  NaN block of fq(P): masked keys are outside the NaN check, as in docs/NUMERICS.md, section 2.1), and the NaN of Q
  and dO are read as 0 in dS^T Q and fq(P)^T dO (the walk's caller sets the NaN of visible pairs)."""
  qm = start_m + offs_m
  rows = qm.to(tl.int64)[:, None]
  # Rows are masked in masked tiles only: every row of an unmasked tile is live (q_tile_range).
  ok = offs_d[None, :] < HEAD_DIM
  if MASKED:
    row_ok = qm < tq
    ok = ok & row_ok[:, None]
  q = tl.load(q_base + rows * stride_qt + offs_d[None, :], mask=ok, other=0.0)
  do = tl.load(do_base + rows * stride_dt + offs_d[None, :], mask=ok, other=0.0)
  if MASKED:
    lse = tl.load(lse_base + qm, mask=qm < q_lim, other=float("-inf"))  # padded rows: P = 0
    delta = tl.load(delta_base + qm, mask=row_ok, other=0.0)
  else:
    lse = tl.load(lse_base + qm)
    delta = tl.load(delta_base + qm)
  lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)  # P = 0 for such rows
  if QUANTIZE_P and P_ROW_RANGE > 0:
    # Two-level: R * exp(S - m) with m the forward's final row max, formed below as p * (R * l),
    # l = exp(lse - m): one product per probability (a second exp per probability made "row" 40% slower),
    # and the rounding of lse cancels between p and l. R * l and 1 / (R * l) come per row from
    # attention_bwd_row_factors_kernel (1 and 0 for rows without keys, whose p is 0). Loaded here, beside lse, so
    # nothing waits on a load between the tile's dots.
    if MASKED:
      rl = tl.load(rf_base + qm, mask=qm < q_lim, other=1.0)
      inv_rl = tl.load(rf_base + tq + qm, mask=qm < q_lim, other=0.0)
    else:
      rl = tl.load(rf_base + qm)
      inv_rl = tl.load(rf_base + tq + qm)
  s_t = qk_dot(k, q, QK_F32, DOT_PREC) * qk_scale
  p_t = tl.math.exp2(s_t - lse2[None, :])  # [BLOCK_N, BLOCK_M]
  if MASKED:
    # Masked keys must be exactly +0 before fq(P): they share blocks of 16 with valid keys.
    seg_q = qm
    if HAS_SEG:
      seg_q = tl.load(q_seg_base + qm, mask=row_ok, other=0)
    valid = visible(qm[None, :], kn[:, None], seg_q[None, :], seg_k[:, None], q_lim, kv_lim, off, IS_CAUSAL,
                    WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG)
    p_t = tl.where(valid, p_t, 0.0)
  dp_t = qk_dot(v, do, QK_F32, DOT_PREC)
  if QKV_TENSOR:
    dp_t = dp_t * v_dec
  ds_t = p_t * (dp_t - delta[None, :])
  if EXACT:
    tl.static_assert(MASKED, "the exact tile applies the elementwise mask")
    ds_t = tl.where(valid, ds_t, 0.0)
    q = tl.where(common.nan_of(q), tl.zeros_like(q), q)
    do = tl.where(common.nan_of(do), tl.zeros_like(do), do)
  if QKV_TENSOR:  # dK sums over the query heads of a KV head, each with its own Q decode scale
    dk += bf16_dot(ds_t, q, DOT_BF16, DOT_PREC, SOFT_BF16) * q_dec
  else:
    dk += bf16_dot(ds_t, q, DOT_BF16, DOT_PREC, SOFT_BF16)
  if QUANTIZE_P and P_ROW_RANGE > 0:
    p_t = fq_probs_t(p_t * rl[None, :], BLOCK_N, BLOCK_M, HW_E4M3, HW_E2M1) * inv_rl[None, :]
  elif QUANTIZE_P:
    p_t = fq_probs_t(p_t, BLOCK_N, BLOCK_M, HW_E4M3, HW_E2M1)  # blocks of 16 along keys (axis 0)
  if EXACT:
    p_t = tl.where(valid, p_t, 0.0)
  dv += bf16_dot(p_t, do, DOT_BF16, DOT_PREC, SOFT_BF16)
  return dk, dv


@triton.jit
def _dkdv_program(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, rf_ptr, scale, tq, tk, n_heads, group,
    q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr,
    dk_ptr, dv_ptr, strides,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr, HAS_SEG: tl.constexpr,
    QUANTIZE_P: tl.constexpr, QK_F32: tl.constexpr, DOT_BF16: tl.constexpr, SOFT_BF16: tl.constexpr,
    DOT_PREC: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr, P_ROW_RANGE: tl.constexpr,
    QKV_TENSOR: tl.constexpr, EXACT: tl.constexpr = False):
  """One program of ``attention_bwd_dkdv_kernel``; EXACT: its exact walk (every query tile masked, dS and fq(P) 0 at
  masked pairs, Q's and dO's NaN read as 0; stores, then NaN where a visible pair meets a NaN of Q (dK) or dO (dV)).
  Otherwise the fast walks; returns whether a NaN reached dK or dV (with a mask that hides pairs: else False). As in
  the forward (``_fwd_program``) the exact walk recomputes everything from the arguments; strides: the kernel's 12,
  q's, k's, v's and do's, as a tuple (``program_start``)."""
  (strides, tq, tk, n_heads, group, pid_bk, b, kvh, start_n, kn, offs_m, offs_d, key_ok, q_lim, kv_lim, off, seg_k,
   q_seg_base) = program_start(strides, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, BLOCK_N,
                               BLOCK_M, D_PAD, IS_CAUSAL, BOTTOM_RIGHT, HAS_Q_LEN, HAS_KV_LEN, HAS_SEG, False, 1,
                               SOFT_BF16, EXACT)
  (stride_qb, stride_qt, stride_qn, stride_kb, stride_kt, stride_kn, stride_vb, stride_vt, stride_vn, stride_db,
   stride_dt, stride_dn) = strides
  keys = kn.to(tl.int64)[:, None]
  ok = key_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
  k_off = b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kn + keys * stride_kt + offs_d[None, :]
  v_off = b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vn + keys * stride_vt + offs_d[None, :]
  k = tl.load(k_ptr + k_off, mask=ok, other=0.0)
  v = tl.load(v_ptr + v_off, mask=ok, other=0.0)
  qk_scale = scale * LOG2E
  k_dec = 1.0  # decode scales: qkv_scale="tensor" only
  v_dec = 1.0
  if QKV_TENSOR:
    k_dec = tl.div_rn(1.0, tl.load(k_enc_ptr + pid_bk))
    v_dec = tl.div_rn(1.0, tl.load(v_enc_ptr + pid_bk))

  # Query tiles [lo, a) and [c, hi) need the elementwise mask (causal diagonal, window edges, segments, or
  # every tile when this key tile is ragged); [a, c) do not; rows outside [lo, hi) see none of these keys.
  lo, a, c, hi = q_tile_range(start_n, q_lim, kv_lim, off, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
  if HAS_SEG:  # packed documents: only the query rows of this key tile's segments; unmasked inside a lone one
    lo, a, c, hi = narrow_to_segments(lo, a, c, hi, seg_k, kn < kv_lim, q_seg_base, q_lim,
                                      tl.load(seg_sorted_ptr + b), BLOCK_M)

  dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
  dv = tl.zeros([BLOCK_N, D_PAD], tl.float32)
  # NaN at a masked pair (see the dQ kernel): dS = 0 * NaN where V . dO^T or delta is NaN (a NaN cotangent of a padded
  # row), Q's or dO's NaN times a masked pair's 0, and a NaN block of fq(P) that covers masked keys can only add a
  # NaN. A program whose keys end without one is exact; otherwise the exact walk follows. Once per program when there
  # is no NaN: one compare per element of dK and dV and a reduction.
  HIDES: tl.constexpr = IS_CAUSAL or WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0 or HAS_SEG or HAS_Q_LEN or HAS_KV_LEN
  leaked = False
  if EXACT:
    for g in range(group):
      h = kvh * group + g
      bh = b * n_heads + h
      q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qn
      do_base = do_ptr + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dn
      q_dec = 1.0
      if QKV_TENSOR:
        q_dec = tl.div_rn(1.0, tl.load(q_enc_ptr + bh))
        qk_scale = scale * q_dec * k_dec * LOG2E
      for start_m in range(lo, hi, BLOCK_M):
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_ptr + bh.to(tl.int64) * tq,
                            delta_ptr + bh.to(tl.int64) * tq, rf_ptr + bh.to(tl.int64) * (2 * tq), start_m, kn,
                            offs_m, offs_d, seg_k, q_seg_base, q_lim, kv_lim, off, tq, stride_qt, stride_dt, qk_scale,
                            q_dec, v_dec, True, HEAD_DIM, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P,
                            BLOCK_M, BLOCK_N, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE,
                            QKV_TENSOR, EXACT=True)
    tl.store(dk_ptr + k_off, cast_out(dk * scale, dk_ptr, SOFT_BF16), mask=ok)
    tl.store(dv_ptr + v_off, cast_out(dv, dv_ptr, SOFT_BF16), mask=ok)
    # NaN where a visible pair meets a NaN of Q (dK) or dO (dV), 16 channels at a time.
    for c0 in range(0, D_PAD, NAN_CHANNELS):
      offs_c = c0 + tl.arange(0, NAN_CHANNELS)
      c_ok = offs_c[None, :] < HEAD_DIM
      hits_q = tl.zeros([BLOCK_N, NAN_CHANNELS], tl.float32)
      hits_do = tl.zeros([BLOCK_N, NAN_CHANNELS], tl.float32)
      for g in range(group):
        h = kvh * group + g
        q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qn
        do_base = do_ptr + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dn
        for start_m in range(lo, hi, BLOCK_M):
          qm = start_m + offs_m
          rows = qm.to(tl.int64)[:, None]
          live = (qm < tq)[:, None] & c_ok
          seg_q = qm
          if HAS_SEG:
            seg_q = tl.load(q_seg_base + qm, mask=qm < tq, other=0)
          valid = visible(qm[None, :], kn[:, None], seg_q[None, :], seg_k[:, None], q_lim, kv_lim, off, IS_CAUSAL,
                          WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG)
          q_t = tl.load(q_base + rows * stride_qt + offs_c[None, :], mask=live, other=0.0)
          do_t = tl.load(do_base + rows * stride_dt + offs_c[None, :], mask=live, other=0.0)
          hits_q += common.nan_hits(valid, common.nan_of(q_t), DOT_BF16, DOT_PREC).to(tl.float32)
          hits_do += common.nan_hits(valid, common.nan_of(do_t), DOT_BF16, DOT_PREC).to(tl.float32)
      nan_out = tl.full([BLOCK_N, NAN_CHANNELS], float("nan"), tl.float32)
      ck_off = b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kn + keys * stride_kt + offs_c[None, :]
      cv_off = b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vn + keys * stride_vt + offs_c[None, :]
      tl.store(dk_ptr + ck_off, cast_out(nan_out, dk_ptr, SOFT_BF16), mask=key_ok[:, None] & c_ok & (hits_q > 0.0))
      tl.store(dv_ptr + cv_off, cast_out(nan_out, dv_ptr, SOFT_BF16), mask=key_ok[:, None] & c_ok & (hits_do > 0.0))
  else:
    for g in range(group):  # the query heads of this KV head, in a fixed order: deterministic
      h = kvh * group + g
      bh = b * n_heads + h
      q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qn
      do_base = do_ptr + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dn
      lse_base = lse_ptr + bh.to(tl.int64) * tq
      delta_base = delta_ptr + bh.to(tl.int64) * tq
      rf_base = rf_ptr + bh.to(tl.int64) * (2 * tq)
      q_dec = 1.0
      if QKV_TENSOR:
        q_dec = tl.div_rn(1.0, tl.load(q_enc_ptr + bh))
        qk_scale = scale * q_dec * k_dec * LOG2E
      for start_m in range(lo, a, BLOCK_M):
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, rf_base, start_m, kn, offs_m, offs_d,
                            seg_k, q_seg_base, q_lim, kv_lim, off, tq, stride_qt, stride_dt, qk_scale, q_dec, v_dec,
                            True, HEAD_DIM, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P, BLOCK_M, BLOCK_N,
                            QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE, QKV_TENSOR)
      for start_m in range(a, c, BLOCK_M):
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, rf_base, start_m, kn, offs_m, offs_d,
                            seg_k, q_seg_base, q_lim, kv_lim, off, tq, stride_qt, stride_dt, qk_scale, q_dec, v_dec,
                            False, HEAD_DIM, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P, BLOCK_M,
                            BLOCK_N, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE, QKV_TENSOR)
      for start_m in range(c, hi, BLOCK_M):
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, rf_base, start_m, kn, offs_m, offs_d,
                            seg_k, q_seg_base, q_lim, kv_lim, off, tq, stride_qt, stride_dt, qk_scale, q_dec, v_dec,
                            True, HEAD_DIM, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, HAS_SEG, QUANTIZE_P, BLOCK_M, BLOCK_N,
                            QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE, QKV_TENSOR)
    if HIDES:
      leaked = common.any_nan(dk, key_ok) | common.any_nan(dv, key_ok)
    # Not stored when the exact walk follows: dK and dV may be stored over fq(K) and fq(V) (``Plan.stored_in``),
    # which that walk reads again.
    if leaked == 0:
      tl.store(dk_ptr + k_off, cast_out(dk * scale, dk_ptr, SOFT_BF16), mask=ok)
      tl.store(dv_ptr + v_off, cast_out(dv, dv_ptr, SOFT_BF16), mask=ok)
  return leaked


@triton.jit
def attention_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, rf_ptr, scale, tq, tk, n_heads, group,
    q_len_ptr, kv_len_ptr, q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr, leak_ptr,
    stride_qb, stride_qt, stride_qn, stride_kb, stride_kt, stride_kn, stride_vb, stride_vt, stride_vn,
    stride_db, stride_dt, stride_dn,
    dk_ptr, dv_ptr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HAS_Q_LEN: tl.constexpr, HAS_KV_LEN: tl.constexpr, HAS_SEG: tl.constexpr,
    QUANTIZE_P: tl.constexpr, QK_F32: tl.constexpr, DOT_BF16: tl.constexpr, SOFT_BF16: tl.constexpr,
    DOT_PREC: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr, P_ROW_RANGE: tl.constexpr,
    QKV_TENSOR: tl.constexpr, REDO: tl.constexpr = False):
  """dK, dV for keys [i * BLOCK_N, +BLOCK_N) of KV head j % K, batch j // K, ``(i, j) = program_tile(...)``.

  Arrays and masks as in ``attention_bwd_dq_kernel``; dk, dv: [B, Tk, K, D] with the
  strides of k and v. Grid: (cdiv(Tk, BLOCK_N), B * K), longest walk first when causal (``program_tile``).
  BLOCK_N % 16 == 0.
  P_ROW_RANGE: 0 (p_scale="block"; ``rf_ptr`` is not read) or R = 6 * 448 ("row": rf [B, N, 2, Tq] fp32, R * l
  and 1 / (R * l) per query row from ``attention_bwd_row_factors_kernel``).
  QKV_TENSOR: as in ``attention_bwd_dq_kernel`` (the enc pointers are read only then).
  REDO: after the warp-specialized causal walk (``attention_bwd_ws``, whose fast walk computes this kernel's fast
  walk's values): only the exact walk, and only where ``leak_ptr`` ([B * K, cdiv(Tk, BLOCK_N)] int32, this launch's
  grid) flags that a NaN reached the key tile's dK or dV there (that launch then stored nothing of it: fq(K) and fq(V)
  are still in dK's and dV's storage). Not read otherwise.
  """
  strides = (stride_qb, stride_qt, stride_qn, stride_kb, stride_kt, stride_kn, stride_vb, stride_vt, stride_vn,
             stride_db, stride_dt, stride_dn)
  if REDO:  # the fast walk was the warp-specialized kernel's: its flag says whether a NaN reached it
    pid_t, pid_bk = common.program_tile(IS_CAUSAL, False)
    leaked = tl.load(leak_ptr + pid_bk * tl.num_programs(0) + pid_t) != 0
  else:
    leaked = _dkdv_program(
        q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, rf_ptr, scale, tq, tk, n_heads, group, q_len_ptr, kv_len_ptr,
        q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr, dk_ptr, dv_ptr, strides, HEAD_DIM,
        D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, BOTTOM_RIGHT, HAS_Q_LEN, HAS_KV_LEN, HAS_SEG,
        QUANTIZE_P, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1, P_ROW_RANGE, QKV_TENSOR, EXACT=False)
  HIDES: tl.constexpr = IS_CAUSAL or WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0 or HAS_SEG or HAS_Q_LEN or HAS_KV_LEN
  if HIDES:
    if leaked:  # a NaN reached dK or dV: the exact walk (_dkdv_program)
      _dkdv_program(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, rf_ptr, scale, tq, tk, n_heads, group, q_len_ptr,
                    kv_len_ptr, q_seg_ptr, kv_seg_ptr, seg_sorted_ptr, q_enc_ptr, k_enc_ptr, v_enc_ptr, dk_ptr, dv_ptr,
                    strides, HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, BOTTOM_RIGHT,
                    HAS_Q_LEN, HAS_KV_LEN, HAS_SEG, QUANTIZE_P, QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3,
                    HW_E2M1, P_ROW_RANGE, QKV_TENSOR, EXACT=True)
