"""NVFP4 QAT attention forward (SPEC section 3) as one Triton kernel.

One program owns ``BLOCK_M`` query rows of one query head and walks the KV
tiles of ``BLOCK_N`` keys from key 0, exactly as the reference does (the
quantized probabilities depend on the running max at each tile). It writes

- ``O``  = (sum over tiles of fq(p_tilde) @ V_hat) / l   (quantized path),
- ``O'`` = (sum over tiles of bf16(p_tilde) @ V_hat) / l (for the backward's delta),
- ``lse`` = m + log(l), natural log, FP32, ``[B, N, Tq]``.

K and V arrive already fake-quantized (``fake_quantize_kernel`` writes fq(K),
fq(V) once, instead of every query block re-quantizing them); Q is quantized
here, once per program. The softmax runs in base 2 with log2(e) folded into
the scale: exp2(x * log2 e) equals exp(x) to within FP32 rounding, so fq(p)
rounds as in the reference except where p sits on a rounding boundary.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels_triton.nvfp4 import fake_quantize_kernel, fq_probs, fq_tile

# (BLOCK_M, num_warps, num_stages) by head dim: the Q tile and two pipelined
# K/V tiles must fit the 228 KB of Hopper shared memory (D = 256 halves BLOCK_M).
# ptxas -v on sm_90 with the stride hints: D = 128, 64/4/3 and 128/8/2: 255 registers,
# no spills; D = 64, 128/8/3 clean; D = 256, 64/8/2: 200 B of spills, 160 KB smem.
# D = 128 and 64 from the H200 sweeps of 2026-11-30 (docs/BENCHMARKS.md).
_CONFIGS = {64: (128, 8, 3), 128: (64, 4, 3), 256: (64, 8, 2)}


def launch_config(head_dim: int) -> dict:
  """``{"BLOCK_M", "num_warps", "num_stages"}`` for head dim ``head_dim`` (a multiple of 16)."""
  key = min((d for d in _CONFIGS if d >= head_dim), default=256)
  block_m, warps, stages = _CONFIGS[key]
  return {"BLOCK_M": block_m, "num_warps": warps, "num_stages": stages}


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
def _aligned3(a, b, c):
  """The three strides, known to be multiples of 16 elements, in a form the compiler can see.

  ``tl.multiple_of`` on a kernel argument is dropped (no defining op to carry the
  hint); ``x // 16 * 16`` is the identity here and its divisibility is inferred.
  """
  return a // 16 * 16, b // 16 * 16, c // 16 * 16


def fake_quantize_launch(rows: int, cols: int) -> tuple[tuple[int, int], dict]:
  """Grid and launch parameters of :func:`fake_quantize_rows_kernel` for ``rows`` rows of ``cols`` channels."""
  block_c = min(128, triton.next_power_of_2(cols))
  block_r = max(1, 4096 // block_c)
  grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
  return grid, {"BLOCK_R": block_r, "BLOCK_C": block_c, "num_warps": 4, "num_stages": 1}


@triton.jit
def fake_quantize_rows_kernel(x_ptr, rows, cols, stride_x, stride_out, out_ptr, BLOCK_R: tl.constexpr,
                              BLOCK_C: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """``nvfp4.fake_quantize_kernel`` (same arguments, same result) for ``cols % 16 == 0`` and strides
  that are multiples of 16, as for Q, K, V here (D % 16 == 0).

  The hints let the compiler use 16-byte loads and stores; without them (jax-triton
  does not specialize integers) it emitted 2-byte LDG.E.U16 / STG.E.U16.
  """
  fake_quantize_kernel(x_ptr, rows, cols // 16 * 16, stride_x // 16 * 16, stride_out // 16 * 16, out_ptr, BLOCK_R,
                       BLOCK_C, HW_E4M3, HW_E2M1)


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
def load_kv_tile(k_base, v_base, start_n, offs_n, offs_d, tk, stride_kt, stride_vt, MASKED: tl.constexpr):
  """K and V rows ``[start_n, start_n + BLOCK_N)`` of one KV head, ``[BLOCK_N, D]`` each; with MASKED,
  rows at or past ``tk`` read as 0 (tiles without a ragged tail load unmasked)."""
  kn = start_n + offs_n
  k_ptrs = k_base + tl.cast(start_n, tl.int64) * stride_kt + offs_n[:, None] * stride_kt + offs_d[None, :]
  v_ptrs = v_base + tl.cast(start_n, tl.int64) * stride_vt + offs_n[:, None] * stride_vt + offs_d[None, :]
  if MASKED:
    k = tl.load(k_ptrs, mask=kn[:, None] < tk, other=0.0)
    v = tl.load(v_ptrs, mask=kn[:, None] < tk, other=0.0)
  else:
    k = tl.load(k_ptrs)
    v = tl.load(v_ptrs)
  return k, v


@triton.jit
def _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, tk, stride_kt, stride_vt,
             qk_scale, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, QUANTIZE_P: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QK_F32: tl.constexpr, DOT_BF16: tl.constexpr,
             SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """One KV tile of the online softmax; MASKED for tiles that hold the causal diagonal or the ragged tail."""
  kn = start_n + offs_n
  k, v = load_kv_tile(k_base, v_base, start_n, offs_n, offs_d, tk, stride_kt, stride_vt, MASKED)
  s = qk_dot(q, k, QK_F32, DOT_PREC) * qk_scale  # log2 units
  if MASKED:
    valid = kn[None, :] < tk
    if IS_CAUSAL:
      valid = valid & (kn[None, :] <= offs_m[:, None])
    s = tl.where(valid, s, float("-inf"))
  m_new = tl.maximum(m, tl.max(s, axis=1))
  m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
  p = tl.math.exp2(s - m_safe[:, None])  # exactly +0 where masked (s = -inf)
  alpha = tl.math.exp2(m - m_safe)
  l = l * alpha + tl.sum(p, axis=1)
  acc_hp = acc_hp * alpha[:, None] + bf16_dot(p, v, DOT_BF16, DOT_PREC, SOFT_BF16)
  if QUANTIZE_P:
    p_fq = fq_probs(p, BLOCK_M, BLOCK_N, HW_E4M3, HW_E2M1)  # exact in bf16
    acc = acc * alpha[:, None] + bf16_dot(p_fq, v, DOT_BF16, DOT_PREC, SOFT_BF16)
  return acc, acc_hp, m_new, l


@triton.jit
def kv_tile_range(start_m, tk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
  """``(full_end, end)`` for the query block starting at ``start_m``: KV tiles ``[0, full_end)``
  need no mask (inside Tk and, under causality, at or below every row of the block); tiles
  ``[full_end, end)`` are masked; causal tiles past ``end`` are skipped."""
  end = tk
  if IS_CAUSAL:
    end = tl.minimum(tk, start_m + BLOCK_M)
  full_end = (tk // BLOCK_N) * BLOCK_N
  if IS_CAUSAL:
    full_end = tl.minimum(full_end, (start_m // BLOCK_N) * BLOCK_N)
  full_end = tl.minimum(full_end, end)
  return full_end, end


@triton.jit
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, scale, tq, tk, n_heads, group,
    stride_qb, stride_qt, stride_qn, stride_kb, stride_kt, stride_kn, stride_vb, stride_vt, stride_vn,
    stride_ob, stride_ot, stride_on,
    o_ptr, o_hp_ptr, lse_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    QUANTIZE_Q: tl.constexpr, QUANTIZE_P: tl.constexpr, QK_F32: tl.constexpr, DOT_BF16: tl.constexpr,
    SOFT_BF16: tl.constexpr, DOT_PREC: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """Forward of SPEC section 3 for query rows [pid0 * BLOCK_M, +BLOCK_M) of head pid1 % N, batch pid1 // N.

  q: [B, Tq, N, D]; k, v: [B, Tk, K, D] (already fq when QUANTIZE_QKV), N = K * group;
  the last axis of every array is contiguous. Outputs: o, o_hp [B, Tq, N, D]
  (strides stride_o*), lse [B, N, Tq] fp32 contiguous. Grid: (cdiv(Tq, BLOCK_M), B * N).
  Flags: ``dot_flags`` and ``nvfp4.quant_flags``.
  """
  # Every stride is a multiple of HEAD_DIM (rows of D % 16 == 0 contiguous elements).
  # jax-triton does not specialize integer arguments, so without these hints the
  # compiler cannot vectorize the tile loads (it emitted 2-byte LDG.E.U16) nor
  # pipeline them through cp.async.
  stride_qb, stride_qt, stride_qn = _aligned3(stride_qb, stride_qt, stride_qn)
  stride_kb, stride_kt, stride_kn = _aligned3(stride_kb, stride_kt, stride_kn)
  stride_vb, stride_vt, stride_vn = _aligned3(stride_vb, stride_vt, stride_vn)
  stride_ob, stride_ot, stride_on = _aligned3(stride_ob, stride_ot, stride_on)
  pid_m = tl.program_id(0)
  pid_bh = tl.program_id(1)
  b = pid_bh // n_heads
  h = pid_bh % n_heads
  kvh = h // group
  start_m = pid_m * BLOCK_M
  offs_m = start_m + tl.arange(0, BLOCK_M)
  offs_n = tl.arange(0, BLOCK_N)
  offs_d = tl.arange(0, HEAD_DIM)
  row_ok = offs_m < tq

  q_ptrs = (q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qn
            + offs_m.to(tl.int64)[:, None] * stride_qt + offs_d[None, :])
  q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
  if QUANTIZE_Q:
    q = fq_tile(q.to(tl.float32), row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), BLOCK_M, HEAD_DIM, HW_E4M3,
                HW_E2M1).to(q.dtype)  # exact: fq values fit the input dtype
  k_base = k_ptr + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kn
  v_base = v_ptr + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vn
  qk_scale = scale * 1.4426950408889634  # log2(e): the softmax runs on exp2

  m = tl.full([BLOCK_M], float("-inf"), tl.float32)
  l = tl.zeros([BLOCK_M], tl.float32)
  acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
  acc_hp = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

  full_end, end = kv_tile_range(start_m, tk, BLOCK_M, BLOCK_N, IS_CAUSAL)
  for start_n in range(0, full_end, BLOCK_N):
    acc, acc_hp, m, l = _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, tk,
                                 stride_kt, stride_vt, qk_scale, False, IS_CAUSAL, QUANTIZE_P, BLOCK_M, BLOCK_N,
                                 QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1)
  for start_n in range(full_end, end, BLOCK_N):
    acc, acc_hp, m, l = _kv_tile(acc, acc_hp, m, l, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, tk,
                                 stride_kt, stride_vt, qk_scale, True, IS_CAUSAL, QUANTIZE_P, BLOCK_M, BLOCK_N,
                                 QK_F32, DOT_BF16, SOFT_BF16, DOT_PREC, HW_E4M3, HW_E2M1)

  empty = l == 0.0  # no visible key: O = O' = 0 and lse = -inf, never NaN
  inv = tl.where(empty, 0.0, tl.div_rn(1.0, tl.where(empty, 1.0, l)))
  lse = tl.where(empty, float("-inf"), (m + tl.math.log2(tl.where(empty, 1.0, l))) * 0.6931471805599453)
  o_off = (b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_on
           + offs_m.to(tl.int64)[:, None] * stride_ot + offs_d[None, :])
  out_hp = cast_out(acc_hp * inv[:, None], o_hp_ptr, SOFT_BF16)
  tl.store(o_hp_ptr + o_off, out_hp, mask=row_ok[:, None])
  if QUANTIZE_P:
    tl.store(o_ptr + o_off, cast_out(acc * inv[:, None], o_ptr, SOFT_BF16), mask=row_ok[:, None])
  else:
    tl.store(o_ptr + o_off, out_hp, mask=row_ok[:, None])  # bf16(p) on both paths: O = O'
  tl.store(lse_ptr + pid_bh.to(tl.int64) * tq + offs_m, lse, mask=row_ok)
