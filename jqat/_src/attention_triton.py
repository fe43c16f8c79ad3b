"""The ``"triton"`` implementation of QAT attention: the kernels of ``kernels_triton`` bound through ``ffi``.

Same signatures and semantics as ``attention_reference.forward`` / ``backward``;
the caller (``jqat._src.attention``) has validated the inputs and picks O or O'
as ``out_for_delta`` (the ``high_precision_delta`` switch).
"""

from __future__ import annotations

from ffi import attention as ffi_attention
from jqat._src.attention_reference import QATConfig


def forward(query, key, value, *, scale: float, is_causal: bool, block_n: int, cfg: QATConfig):
  """query: [B, Tq, N, D]; key, value: [B, Tk, K, D]. Returns O, O' [B, Tq, N, D] and lse [B, N, Tq] fp32."""
  return ffi_attention.attention_forward(query, key, value, scale=scale, is_causal=is_causal, block_n=block_n,
                                         quantize_qkv=cfg.quantize_qkv, quantize_p=cfg.quantize_p)


def backward(d_out, query, key, value, out_for_delta, lse, *, scale: float, is_causal: bool, cfg: QATConfig):
  """d_out, out_for_delta, query: [B, Tq, N, D]; key, value: [B, Tk, K, D]; lse: [B, N, Tq] fp32.

  Returns dQ, dK, dV in the dtypes of query, key, value.
  """
  return ffi_attention.attention_backward(d_out, query, key, value, out_for_delta, lse, scale=scale,
                                          is_causal=is_causal, quantize_qkv=cfg.quantize_qkv,
                                          quantize_p_backward=cfg.quantize_p_backward)
