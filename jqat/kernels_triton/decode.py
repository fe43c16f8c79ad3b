"""Decode attention over a packed NVFP4 KV cache, and the cache write (docs/NUMERICS.md, section 10).

Framework-free (Triton only). A cache tensor is a pair ``(codes, scales)`` laid out as
``jqat.nvfp4.quantize`` returns it along D: ``codes`` uint8 ``[..., D // 2]`` (element 2i in the low
nibble) and ``scales`` E4M3 bytes ``[..., D // 16]``, with the leading axes ``[B, T, K]`` (contiguous) or
``[num_pages, page_size, K]`` (paged, rows found through a ``page_table [B, pages_per_seq]``).

- :func:`kv_cache_write_kernel` quantizes new K or V rows and stores their codes and scales in place,
  bit for bit those of ``jqat.nvfp4.quantize``.
- :func:`decode_split_kernel`: one program per (batch, KV head, block of query rows, split) holds the G
  query heads of its KV head times the Tq new tokens as rows, so each cache byte is read once per split
  walk. It reads codes and scales and rounds them to values in registers (never a dequantized copy in
  memory), walks its split's KV tiles as the training forward walks its tiles (fq(P) per tile relative
  to the running max) and writes its unnormalized partial (acc, m, l), or O itself when there is one split.
- :func:`decode_combine_kernel` merges the splits of one row by their maxima (flash-decoding).

Values in registers: code ``c`` (sign, 2 exponent bits, 1 mantissa bit) becomes the FP16 bit pattern
``sign << 15 | (c & 7) << 9``, which is E2M1(c) * 2**-14 exactly (exponent bits 1..2 give the normal
E2M1 values, exponent 0 the subnormal 0.5), times the block scale in FP16 (exact: E2M1 times E4M3 has at
most 6 significant bits and is a multiple of 2**-24 after the shift). The factor 2**14 goes into the
softmax scale (K) and the final normalization (V): powers of two, so every FP32 result keeps its bits.
The products run on FP16 tensor cores, exact for fq(Q) and fq(P) (values of E2M1 x E4M3, which FP16
holds); unquantized BF16 operands (the switches off) take BF16 dots instead.

Even and odd channels are kept apart (the low and the high nibbles of a code byte): Q.K is the sum of
the even and odd channels' products and P V gives the even and odd output channels, so no interleaving
is done per tile, only once when a program stores its rows.
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from jqat.kernels_triton.attention_common import LOG2_P_ROW_RANGE, LOG2E, aligned3, round_bf16
from jqat.kernels_triton.nvfp4 import (
  _max_nan,
  corrected_quotient,
  e2m1_tree,
  e4m3_block_scale,
  fq_probs,
  fq_tile,
  rcp_approx,
  round_e2m1,
)

MAX_ROWS_PER_PROGRAM = 64


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Launch configuration of :func:`decode_split_kernel`: query rows per program, warps and pipeline stages.

  The KV tile ``BLOCK_N`` is not here: it is part of the function (``block_n`` of the API)."""

  block_m: int
  num_warps: int
  num_stages: int
  cvt: int = 0  # 1: codes to FP16 by the E4M3 conversion instruction (sm_89+), else by integer bit operations


def decode_config(rows: int) -> DecodeConfig:
  """The default :class:`DecodeConfig` for ``rows`` = G * Tq query rows per KV head."""
  block_m = min(MAX_ROWS_PER_PROGRAM, max(16, triton.next_power_of_2(rows)))
  # Two warps for 16 rows: of 2 and 4 warps, 2 or 3 stages, integer or E4M3-conversion codes, this was the fastest
  # or within 2% of it at (8, 32, 8, 32768, 128) and (64, 8, 1, 4096, 128) (benchmarks/decode.py --sweep); with 4
  # warps each warp reloads the query operand from shared memory every tile. More rows need 4 warps' registers.
  return DecodeConfig(block_m, 2 if block_m <= 16 else 4, 2, cvt=1)


# ----------------------------------------------------------------------------- reading the cache


@triton.jit
def e4m3_bits_to_f32(b):
  """FP32 value of E4M3 (fn) bit patterns ``b`` (integer tensor, 0..255); 0x7F / 0xFF are NaN."""
  b = b.to(tl.int32)
  e = (b >> 3) & 15
  m = b & 7
  normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
  mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
  mag = tl.where((b & 0x7F) == 0x7F, float("nan"), mag)
  return tl.where((b & 0x80) != 0, -mag, mag)


@triton.jit
def _nibble_values_asm(codes):
  """``(low, high)`` nibbles of uint8 ``codes`` as FP16 ``E2M1 * 2**-14`` (see the module docstring), four bytes at
  a time: one byte permute per two bytes, then shifts and masks on two FP16 lanes per register. Not pure, so that
  the compiler keeps it where the codes are loaded (16 bytes a thread) instead of repeating it in the tensor cores'
  operand layout, where each thread holds single bytes."""
  return tl.inline_asm_elementwise(
      asm="""{
      .reg .b32 x, t;
      prmt.b32 x, $4, 0, 0x4140;
      shl.b32 t, x, 12; and.b32 t, t, 0x80008000; shl.b32 $0, x, 9; and.b32 $0, $0, 0x0E000E00; or.b32 $0, $0, t;
      shl.b32 t, x, 8; and.b32 t, t, 0x80008000; shl.b32 $2, x, 5; and.b32 $2, $2, 0x0E000E00; or.b32 $2, $2, t;
      prmt.b32 x, $4, 0, 0x4342;
      shl.b32 t, x, 12; and.b32 t, t, 0x80008000; shl.b32 $1, x, 9; and.b32 $1, $1, 0x0E000E00; or.b32 $1, $1, t;
      shl.b32 t, x, 8; and.b32 t, t, 0x80008000; shl.b32 $3, x, 5; and.b32 $3, $3, 0x0E000E00; or.b32 $3, $3, t;
      }""",
      constraints="=r,=r,=r,=r,r", args=[codes], dtype=(tl.float16, tl.float16), is_pure=False, pack=4)


@triton.jit
def _nibble_values_cvt(codes):
  """``(low, high)`` nibbles of uint8 ``codes`` as FP16 ``E2M1 * 2**-6``, by the hardware's E4M3 -> FP16 conversion
  (sm_89+): a nibble ``s e e m`` is the E4M3 byte ``s 0 0 0 0 e e m 0 0`` placed so, E2M1 * 2**-6 exactly (exponent
  0 is the subnormal 0.5 * 2**-6). Two conversions per four values."""
  return tl.inline_asm_elementwise(
      asm="""{
      .reg .b32 l, h, t;
      .reg .b16 l0, l1, h0, h1;
      shl.b32 t, $4, 4; and.b32 t, t, 0x80808080; shl.b32 l, $4, 2; and.b32 l, l, 0x1C1C1C1C; or.b32 l, l, t;
      shr.u32 h, $4, 2; and.b32 h, h, 0x1C1C1C1C; and.b32 t, $4, 0x80808080; or.b32 h, h, t;
      mov.b32 {l0, l1}, l; mov.b32 {h0, h1}, h;
      cvt.rn.f16x2.e4m3x2 $0, l0; cvt.rn.f16x2.e4m3x2 $1, l1;
      cvt.rn.f16x2.e4m3x2 $2, h0; cvt.rn.f16x2.e4m3x2 $3, h1;
      }""",
      constraints="=r,=r,=r,=r,r", args=[codes], dtype=(tl.float16, tl.float16), is_pure=False, pack=4)


@triton.jit
def _nibble_values(codes, COMPILED: tl.constexpr, CVT: tl.constexpr):
  """``(low, high)`` nibbles of uint8 ``codes`` as FP16 ``E2M1 / value_shift(CVT)``, the same values on all paths."""
  if COMPILED and CVT:
    return _nibble_values_cvt(codes)
  elif COMPILED:
    return _nibble_values_asm(codes)
  else:
    c = codes.to(tl.int32)
    lo = (((c & 8) << 12) | ((c & 7) << 9)).to(tl.int16).to(tl.float16, bitcast=True)
    hi = (((c & 0x80) << 8) | ((c & 0x70) << 5)).to(tl.int16).to(tl.float16, bitcast=True)
    return lo, hi


@triton.jit
def value_shift(CVT: tl.constexpr):
  """The power of two by which :func:`dequant_tile`'s values are too small: 2**6 through the E4M3 conversion, 2**14
  through FP16 bit patterns."""
  return 64.0 if CVT else 16384.0


@triton.jit
def dequant_tile(codes, scales, ROWS: tl.constexpr, DH: tl.constexpr, NB: tl.constexpr, DTYPE: tl.constexpr,
                 COMPILED: tl.constexpr, CVT: tl.constexpr = False):
  """Even and odd channels ``[ROWS, DH]`` of a cache tile, each ``value / value_shift(CVT)`` in ``DTYPE`` (exact).

  codes: uint8 ``[ROWS, DH]``; scales: E4M3 bytes ``[ROWS, NB]`` (NB * 8 == DH). DTYPE float16 (the quantized
  path, see the module docstring), bfloat16 or float32 (operands of unquantized BF16 / FP32 dots).
  """
  lo, hi = _nibble_values(codes, COMPILED, CVT)
  if DTYPE == tl.float16 and COMPILED:  # the hardware conversion (emulated below sm_89), NaN kept
    s16 = scales.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    s16 = tl.reshape(tl.broadcast_to(s16[:, :, None], [ROWS, NB, 8]), [ROWS, DH])
    return lo * s16, hi * s16
  sc = tl.reshape(tl.broadcast_to(e4m3_bits_to_f32(scales)[:, :, None], [ROWS, NB, 8]), [ROWS, DH])
  if DTYPE == tl.float16:
    s16 = sc.to(tl.float16)  # exact: E4M3 values fit FP16
    return lo * s16, hi * s16
  else:
    return (lo.to(tl.float32) * sc).to(DTYPE), (hi.to(tl.float32) * sc).to(DTYPE)


@triton.jit
def page_ids(pt_ptr, b, pages_per_seq, num_pages, index, ok):
  """Page ids ``page_table[b, index]`` (int64) where ``ok``, else 0, clamped into ``[0, num_pages)``: a bad table
  reads wrong rows of the cache, never memory outside it."""
  page = tl.load(pt_ptr + b.to(tl.int64) * pages_per_seq + index, mask=ok, other=0)
  return tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)


@triton.jit
def _cache_rows(b, kvh, kn, key_ok, pt_ptr, pages_per_seq, num_pages, stride_p, stride_t, stride_k,
                PAGE_SIZE: tl.constexpr):
  """Offsets (int64, in elements) of the cache rows of keys ``kn`` of sequence ``b``, KV head ``kvh``.

  PAGE_SIZE 0: contiguous ``[B, T, K, ...]``; else ``[num_pages, PAGE_SIZE, K, ...]`` through the page table row
  of ``b`` (``pages_per_seq`` entries). Page ids outside ``[0, num_pages)`` are clamped into it: a bad table
  reads wrong rows of the cache, never memory outside it."""
  if PAGE_SIZE > 0:
    page = page_ids(pt_ptr, b, pages_per_seq, num_pages, kn // PAGE_SIZE, key_ok)
    return row_offset(page, kn, kvh, stride_p, stride_t, stride_k, PAGE_SIZE)
  else:
    return row_offset(b, kn, kvh, stride_p, stride_t, stride_k, PAGE_SIZE)


@triton.jit
def row_offset(page, kn, kvh, stride_p, stride_t, stride_k, PAGE_SIZE: tl.constexpr):
  """Offset (int64, in elements) of the cache row of key ``kn``, KV head ``kvh``, in ``page`` (its id from
  :func:`page_ids`), or with PAGE_SIZE 0 in sequence ``page`` of a contiguous cache."""
  if PAGE_SIZE > 0:
    kn = kn % PAGE_SIZE
  return page.to(tl.int64) * stride_p + kn.to(tl.int64) * stride_t + kvh.to(tl.int64) * stride_k


@triton.jit
def _load_tile(codes_ptr, scales_ptr, rows_c, rows_s, key_ok, DH: tl.constexpr, NB: tl.constexpr,
               DH_PAD: tl.constexpr, NB_PAD: tl.constexpr):
  offs_c = tl.arange(0, DH_PAD)
  offs_s = tl.arange(0, NB_PAD)
  scales_ptr = scales_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)  # the E4M3 bit patterns
  if DH == DH_PAD:
    codes = tl.load(codes_ptr + rows_c[:, None] + offs_c[None, :], mask=key_ok[:, None], other=0)
    scales = tl.load(scales_ptr + rows_s[:, None] + offs_s[None, :], mask=key_ok[:, None], other=0)
  else:
    codes = tl.load(codes_ptr + rows_c[:, None] + offs_c[None, :], mask=key_ok[:, None] & (offs_c < DH)[None, :],
                    other=0)
    scales = tl.load(scales_ptr + rows_s[:, None] + offs_s[None, :], mask=key_ok[:, None] & (offs_s < NB)[None, :],
                     other=0)
  return codes, scales


@triton.jit
def _aligned(a, b, c, ALIGN: tl.constexpr):
  """Three strides known to be multiples of ``ALIGN``, in a form the compiler can see (``x // A * A``)."""
  return a // ALIGN * ALIGN, b // ALIGN * ALIGN, c // ALIGN * ALIGN


@triton.jit
def _dot(a, b, DOT_F32: tl.constexpr):
  """``a @ b`` with FP32 accumulation; DOT_F32 (the interpreter) on FP32 operands."""
  if DOT_F32:
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
  else:
    return tl.dot(a, b)


# ----------------------------------------------------------------------------- decode


@triton.jit
def decode_split_kernel(
    q_ptr, kc_ptr, ks_ptr, vc_ptr, vs_ptr, kv_len_ptr, pt_ptr,
    scale, tq, group, kv_heads, rows, row_blocks, capacity, pages_per_seq, num_pages,
    stride_qb, stride_qt, stride_qn, stride_ob, stride_ot, stride_on,
    stride_kcp, stride_kct, stride_kck, stride_ksp, stride_kst, stride_ksk,
    stride_vcp, stride_vct, stride_vck, stride_vsp, stride_vst, stride_vsk,
    o_ptr, part_acc_ptr, part_ml_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, SPLITS: tl.constexpr, QUANTIZE_Q: tl.constexpr, QUANTIZE_P: tl.constexpr,
    P_ROW_RANGE: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr, COMPILED: tl.constexpr,
    CODE_ALIGN: tl.constexpr, SCALE_ALIGN: tl.constexpr, CVT: tl.constexpr = False):
  """One split of the KV walk of one (batch, KV head, row block).

  q: [B, Tq, N, D] (strides stride_q*, last axis contiguous, multiples of 16), N = K * group; row r of a
  (batch, KV head) is query ``r // group`` of head ``kvh * group + r % group``; ``rows`` = group * Tq, in
  ``row_blocks`` blocks of BLOCK_M. Caches: codes ``[.., D // 2]`` and scales ``[.., D // 16]`` (uint8 and E4M3
  bytes) with leading axes ``[B, capacity, K]`` (PAGE_SIZE 0) or ``[num_pages, PAGE_SIZE, K]`` through pt
  ``[B, pages_per_seq]`` int32; kv_len [B] int32, clamped to ``[0, capacity]``. Query i sees keys
  ``j < kv_len``, and with IS_CAUSAL only ``j <= kv_len - Tq + i``.
  The live tiles ``cdiv(kv_len, BLOCK_N)`` are cut into SPLITS runs of ``cdiv(tiles, SPLITS)``; this program
  (``program_id(1)``) walks its run from an empty state. SPLITS 1: O is written to o ([B, Tq, N, D], strides
  stride_o*, multiples of 16); else the unnormalized ``acc`` to part_acc ``[B * K * row_blocks, SPLITS, BLOCK_M,
  D]`` fp32 and ``(m, l)`` (m in log2 units) to part_ml ``[B * K * row_blocks, SPLITS, 2, BLOCK_M]`` fp32.
  Grid: (B * K * row_blocks, SPLITS), KV heads fastest (neighbouring programs share the scales' sectors).
  Flags: QUANTIZE_Q rounds Q's rows in the program; QUANTIZE_P as in the forward (fq(P) per tile, else
  bf16(P)); P_ROW_RANGE 0 or 6 * 448 (p_scale="row"); COMPILED: compiled code (inline PTX, FP16 tensor cores),
  else the interpreter's FP32 path with the same values. CODE_ALIGN / SCALE_ALIGN: a power of two dividing every
  stride of the codes / scales (jax-triton does not specialize integers; the hint lets the loads vectorize).
  """
  stride_qb, stride_qt, stride_qn = aligned3(stride_qb, stride_qt, stride_qn)
  stride_ob, stride_ot, stride_on = aligned3(stride_ob, stride_ot, stride_on)
  stride_kcp, stride_kct, stride_kck = _aligned(stride_kcp, stride_kct, stride_kck, CODE_ALIGN)
  stride_vcp, stride_vct, stride_vck = _aligned(stride_vcp, stride_vct, stride_vck, CODE_ALIGN)
  stride_ksp, stride_kst, stride_ksk = _aligned(stride_ksp, stride_kst, stride_ksk, SCALE_ALIGN)
  stride_vsp, stride_vst, stride_vsk = _aligned(stride_vsp, stride_vst, stride_vsk, SCALE_ALIGN)
  DH: tl.constexpr = HEAD_DIM // 2
  NB: tl.constexpr = HEAD_DIM // 16
  DH_PAD: tl.constexpr = triton.next_power_of_2(DH)
  NB_PAD: tl.constexpr = triton.next_power_of_2(NB)
  D_PAD: tl.constexpr = 2 * DH_PAD
  Q_DTYPE: tl.constexpr = tl.float16 if QUANTIZE_Q else q_ptr.dtype.element_ty
  P_DTYPE: tl.constexpr = tl.float16 if QUANTIZE_P else tl.bfloat16
  DOT_F32: tl.constexpr = (not COMPILED) or Q_DTYPE == tl.float32
  pid = tl.program_id(0)
  split = tl.program_id(1)
  kvh = pid % kv_heads
  rb = (pid // kv_heads) % row_blocks
  b = pid // (kv_heads * row_blocks)

  r = rb * BLOCK_M + tl.arange(0, BLOCK_M)
  row_ok = r < rows
  qi = r // group
  head = kvh * group + r % group
  offs_d = tl.arange(0, D_PAD)
  d_ok = offs_d < HEAD_DIM
  q_rows = b.to(tl.int64) * stride_qb + qi.to(tl.int64) * stride_qt + head.to(tl.int64) * stride_qn
  q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
  if QUANTIZE_Q:  # exact in FP16: E2M1 x E4M3 values
    q = fq_tile(q.to(tl.float32), row_ok[:, None] & d_ok[None, :], BLOCK_M, D_PAD, HW_E4M3, HW_E2M1)
  q_even, q_odd = tl.split(tl.reshape(q.to(Q_DTYPE), [BLOCK_M, DH_PAD, 2]))

  kv_len = tl.minimum(tl.maximum(tl.load(kv_len_ptr + b), 0), capacity)
  limit = kv_len + tl.zeros([BLOCK_M], tl.int32)  # keys below it are visible to the row
  if IS_CAUSAL:
    limit = tl.minimum(limit, kv_len - tq + qi + 1)
  limit = tl.where(row_ok, limit, 0)
  tiles = tl.cdiv(kv_len, BLOCK_N)
  chunk = tl.cdiv(tiles, SPLITS)
  t_lo = tl.minimum(split * chunk, tiles)
  t_hi = tl.minimum(t_lo + chunk, tiles)

  CVT_ON: tl.constexpr = CVT and COMPILED and HW_E4M3
  SHIFT: tl.constexpr = value_shift(CVT_ON)
  qk_scale = scale * LOG2E * SHIFT
  m = tl.full([BLOCK_M], float("-inf"), tl.float32)
  l = tl.zeros([BLOCK_M], tl.float32)
  acc_even = tl.zeros([BLOCK_M, DH_PAD], tl.float32)
  acc_odd = tl.zeros([BLOCK_M, DH_PAD], tl.float32)
  offs_n = tl.arange(0, BLOCK_N)
  for i in range(0, t_hi - t_lo):  # counted from 0: the interpreter takes no tensor as a range's start
    kn = (t_lo + i) * BLOCK_N + offs_n
    key_ok = kn < kv_len
    rows_kc = _cache_rows(b, kvh, kn, key_ok, pt_ptr, pages_per_seq, num_pages, stride_kcp, stride_kct, stride_kck,
                          PAGE_SIZE)
    rows_ks = _cache_rows(b, kvh, kn, key_ok, pt_ptr, pages_per_seq, num_pages, stride_ksp, stride_kst, stride_ksk,
                          PAGE_SIZE)
    k_codes, k_scales = _load_tile(kc_ptr, ks_ptr, rows_kc, rows_ks, key_ok, DH, NB, DH_PAD, NB_PAD)
    rows_vc = _cache_rows(b, kvh, kn, key_ok, pt_ptr, pages_per_seq, num_pages, stride_vcp, stride_vct, stride_vck,
                          PAGE_SIZE)
    rows_vs = _cache_rows(b, kvh, kn, key_ok, pt_ptr, pages_per_seq, num_pages, stride_vsp, stride_vst, stride_vsk,
                          PAGE_SIZE)
    v_codes, v_scales = _load_tile(vc_ptr, vs_ptr, rows_vc, rows_vs, key_ok, DH, NB, DH_PAD, NB_PAD)
    k_even, k_odd = dequant_tile(k_codes, k_scales, BLOCK_N, DH_PAD, NB_PAD, Q_DTYPE, COMPILED, CVT_ON)
    s = _dot(q_even, tl.trans(k_even), DOT_F32) + _dot(q_odd, tl.trans(k_odd), DOT_F32)
    s = s * qk_scale  # log2 units
    valid = kn[None, :] < limit[:, None]
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if QUANTIZE_P and P_ROW_RANGE > 0:
      tl.static_assert(P_ROW_RANGE == 6.0 * 448.0, "LOG2_P_ROW_RANGE is log2(6 * 448)")
      p = tl.math.exp2(s - (m_safe - LOG2_P_ROW_RANGE)[:, None])
    else:
      p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m - m_safe)
    l = l * alpha + tl.sum(p, axis=1)
    if QUANTIZE_P:
      p_op = fq_probs(p, BLOCK_M, BLOCK_N, HW_E4M3, HW_E2M1).to(tl.float16)  # exact
    else:
      p_op = round_bf16(p, not COMPILED)
    v_even, v_odd = dequant_tile(v_codes, v_scales, BLOCK_N, DH_PAD, NB_PAD, P_DTYPE, COMPILED, CVT_ON)
    acc_even = acc_even * alpha[:, None] + _dot(p_op, v_even, DOT_F32)
    acc_odd = acc_odd * alpha[:, None] + _dot(p_op, v_odd, DOT_F32)
    m = m_new

  # Back to natural units of V: the values were read 2**14 times too small.
  acc = tl.reshape(tl.join(acc_even, acc_odd), [BLOCK_M, D_PAD]) * SHIFT
  out_ok = row_ok[:, None] & d_ok[None, :]
  if SPLITS == 1:
    empty = l == 0.0
    inv = tl.where(empty, 0.0, tl.div_rn(1.0, tl.where(empty, 1.0, l)))
    out = tl.where(empty[:, None], 0.0, acc * inv[:, None])
    o_rows = b.to(tl.int64) * stride_ob + qi.to(tl.int64) * stride_ot + head.to(tl.int64) * stride_on
    tl.store(o_ptr + o_rows[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=out_ok)
  else:
    part = pid.to(tl.int64) * SPLITS + split
    rows_here = tl.arange(0, BLOCK_M)
    tl.store(part_acc_ptr + (part * BLOCK_M + rows_here)[:, None] * HEAD_DIM + offs_d[None, :], acc,
             mask=d_ok[None, :] & (rows_here < BLOCK_M)[:, None])
    tl.store(part_ml_ptr + part * 2 * BLOCK_M + rows_here, m)
    tl.store(part_ml_ptr + part * 2 * BLOCK_M + BLOCK_M + rows_here, l)


@triton.jit
def decode_combine_kernel(part_acc_ptr, part_ml_ptr, group, kv_heads, rows, row_blocks, stride_ob, stride_ot,
                          stride_on, o_ptr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr):
  """O of one query row from the SPLITS partials of :func:`decode_split_kernel`:
  ``sum_s w_s acc_s / sum_s w_s l_s`` with ``w_s = exp2(m_s - max_s m_s)``; 0 for a row that sees no key.

  Grid: (B * K * row_blocks, BLOCK_M): program (pid, i) finishes row ``rb * BLOCK_M + i`` of that program's
  (batch, KV head, row block); rows past ``rows`` return at once."""
  pid = tl.program_id(0)
  i = tl.program_id(1)
  rb = (pid // kv_heads) % row_blocks
  r = rb * BLOCK_M + i
  if r < rows:
    kvh = pid % kv_heads
    b = pid // (kv_heads * row_blocks)
    S_PAD: tl.constexpr = triton.next_power_of_2(SPLITS)
    D_PAD: tl.constexpr = triton.next_power_of_2(HEAD_DIM)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_ok = offs_s < SPLITS
    part = pid.to(tl.int64) * SPLITS + offs_s
    m = tl.load(part_ml_ptr + part * 2 * BLOCK_M + i, mask=s_ok, other=float("-inf"))
    l = tl.load(part_ml_ptr + part * 2 * BLOCK_M + BLOCK_M + i, mask=s_ok, other=0.0)
    acc = tl.load(part_acc_ptr + (part * BLOCK_M + i)[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=s_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    m_max = tl.reduce(m, 0, _max_nan)  # a NaN split makes the row NaN
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_safe))
    total = tl.sum(w * l, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0)
    empty = total == 0.0
    out = tl.where(empty, 0.0, out * tl.div_rn(1.0, tl.where(empty, 1.0, total)))
    qi = r // group
    head = kvh * group + r % group
    o_row = b.to(tl.int64) * stride_ob + qi.to(tl.int64) * stride_ot + head.to(tl.int64) * stride_on
    tl.store(o_ptr + o_row + offs_d, out.to(o_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


# ----------------------------------------------------------------------------- writing the cache


@triton.jit
def e2m1_codes(ax, s, AXIS: tl.constexpr, QUOTIENT: tl.constexpr):
  """E2M1 code indices 0..7 (int32) of ``|e2m1(ax / s)|``: ``ax >= 0`` 3-D, ``s`` its E4M3 block scales with the
  block axis ``AXIS`` reduced away. The same decisions as ``nvfp4.e2m1_dequant`` (RNE, saturating at 6, +Inf 6);
  a NaN element gives 0, as ``jqat.nvfp4.quantize`` writes it."""
  if QUOTIENT:
    s3 = tl.expand_dims(s, AXIS)
    y = round_e2m1(tl.minimum(corrected_quotient(ax, s3, tl.expand_dims(rcp_approx(s), AXIS)), 6.0))
    bits = y.to(tl.int32, bitcast=True)
    # 1, 1.5, 2, 3, 4, 6 are codes 2..7: the exponent and the first mantissa bit; 0.5 is code 1.
    code = tl.where(y >= 1.0, (bits >> 22) - 252, tl.where(y > 0.0, 1, 0))
  else:
    upper, mid, odd = e2m1_tree(ax, s, AXIS)
    code = upper.to(tl.int32) * 4 + mid.to(tl.int32) * 2 + odd.to(tl.int32)
  return tl.where(ax != ax, 0, code)


@triton.jit
def e4m3_bits(s):
  """E4M3 bit patterns (int32) of FP32 values ``s`` that are E4M3 values in ``[2**-9, 448]``."""
  b = s.to(tl.int32, bitcast=True)
  normal = ((((b >> 23) & 0xFF) - 120) << 3) | ((b >> 20) & 7)
  return tl.where(s >= 0.015625, normal, (s * 512.0).to(tl.int32))


@triton.jit
def kv_cache_write_kernel(x_ptr, pos_ptr, pt_ptr, codes_in_ptr, scales_in_ptr, n_rows, tn, kv_heads, capacity,
                          pages_per_seq, num_pages, stride_xb, stride_xt, stride_xk, stride_cp, stride_ct, stride_ck,
                          stride_sp, stride_st, stride_sk, codes_ptr, scales_ptr, HEAD_DIM: tl.constexpr,
                          BLOCK_R: tl.constexpr, PAGE_SIZE: tl.constexpr, HW_E4M3: tl.constexpr):
  """Quantizes rows of ``x [B, Tn, K, D]`` (strides stride_x*, last axis contiguous) and stores them into a
  cache at ``pos [B, Tn]`` int32 (dense).

  Row ``(b, t, kvh)`` goes to position ``pos[b, t]`` of sequence ``b`` (contiguous: cache row
  ``[b, pos, kvh]``; paged, PAGE_SIZE > 0: ``[page_table[b, pos // PAGE_SIZE], pos % PAGE_SIZE, kvh]``). A
  position outside ``[0, capacity)`` or a page id outside ``[0, num_pages)`` drops the row's write. Codes and
  scales are those of ``jqat.nvfp4.quantize`` bit for bit (a NaN block: scale 0x7F, its codes quantized on the
  scale 2**-9 with the NaN elements as code 0). codes/scales are written in place: the launch aliases them to
  codes_in/scales_in, which are not read. Grid: (cdiv(n_rows, BLOCK_R),) with n_rows = B * Tn * K.
  """
  NB: tl.constexpr = HEAD_DIM // 16
  D_PAD: tl.constexpr = triton.next_power_of_2(HEAD_DIM)
  NB_PAD: tl.constexpr = D_PAD // 16
  r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
  r_ok = r < n_rows
  kvh = r % kv_heads
  bt = r // kv_heads  # b * Tn + t
  b = bt // tn
  t = bt % tn
  pos = tl.load(pos_ptr + bt, mask=r_ok, other=-1)
  ok = r_ok & (pos >= 0) & (pos < capacity)
  if PAGE_SIZE > 0:
    page = tl.load(pt_ptr + b.to(tl.int64) * pages_per_seq + pos // PAGE_SIZE, mask=ok, other=-1)
    ok = ok & (page >= 0) & (page < num_pages)
    base, within = page.to(tl.int64), (pos % PAGE_SIZE).to(tl.int64)
  else:
    base, within = b.to(tl.int64), pos.to(tl.int64)

  offs_d = tl.arange(0, D_PAD)
  d_ok = offs_d < HEAD_DIM
  x_rows = b.to(tl.int64) * stride_xb + t.to(tl.int64) * stride_xt + kvh.to(tl.int64) * stride_xk
  x = tl.load(x_ptr + x_rows[:, None] + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
  x3 = tl.reshape(x, [BLOCK_R, NB_PAD, 16])
  ax = tl.abs(x3)
  amax = tl.reduce(ax, 2, _max_nan)
  nan = amax != amax
  s = e4m3_block_scale(tl.where(nan, 0.0, amax), HW_E4M3)
  code = e2m1_codes(ax, s, 2, HW_E4M3) | tl.where(x3.to(tl.int32, bitcast=True) < 0, 8, 0)
  nib = tl.reshape(code, [BLOCK_R, D_PAD // 2, 2])
  lo, hi = tl.split(nib)
  packed = (lo | (hi << 4)).to(tl.uint8)
  scale_bits = tl.where(nan, 0x7F, e4m3_bits(s)).to(tl.uint8)
  scales_ptr = scales_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)

  c_rows = base * stride_cp + within * stride_ct + kvh.to(tl.int64) * stride_ck
  s_rows = base * stride_sp + within * stride_st + kvh.to(tl.int64) * stride_sk
  offs_c = tl.arange(0, D_PAD // 2)
  offs_s = tl.arange(0, NB_PAD)
  tl.store(codes_ptr + c_rows[:, None] + offs_c[None, :], packed, mask=ok[:, None] & (offs_c < HEAD_DIM // 2)[None, :])
  tl.store(scales_ptr + s_rows[:, None] + offs_s[None, :], scale_bits, mask=ok[:, None] & (offs_s < NB)[None, :])


def write_launch(n_rows: int, head_dim: int) -> dict:
  """Constexprs and launch parameters of :func:`kv_cache_write_kernel` (about 16 elements per thread)."""
  d_pad = triton.next_power_of_2(head_dim)
  return {"BLOCK_R": max(1, min(64, 2048 // d_pad)), "num_warps": 4, "num_stages": 1}
