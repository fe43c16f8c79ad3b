"""Device functions shared by the attention forward and backward kernels, and the flags they read.

Framework-free (Triton only). The dtype-dependent flags come from :func:`dot_flags`
on the host; the kernels pass them through unchanged.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # the softmax runs on exp2 with log2(e) folded into the scale
LN2 = tl.constexpr(0.6931471805599453)


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
