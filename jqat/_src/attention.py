"""Public QAT attention: validation, implementation dispatch and the custom VJP."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jqat._src import attention_reference as reference
from jqat._src import dispatch
from jqat._src.attention_reference import QATConfig

DEFAULT_BLOCK_N = 64
_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def _check(query, key, value, block_n, implementation):
  """Validates shapes, dtypes and options (SPEC section 6); raises naming the argument."""
  for name, x in (("query", query), ("key", key), ("value", value)):
    if getattr(x, "ndim", None) != 4:
      raise ValueError(f"{name} must have rank 4 [B, T, heads, D], got shape {getattr(x, 'shape', None)}")
    if x.dtype not in _DTYPES:
      raise TypeError(f"{name} must be bfloat16, float16 or float32, got {x.dtype}")
  if not query.dtype == key.dtype == value.dtype:
    raise TypeError(f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
  b, _, n, d = query.shape
  if key.shape != value.shape:
    raise ValueError(f"value must have the shape of key {key.shape}, got {value.shape}")
  if key.shape[0] != b:
    raise ValueError(f"key batch must equal query batch {b}, got {key.shape[0]}")
  if key.shape[3] != d:
    raise ValueError(f"key head dim must equal query head dim {d}, got {key.shape[3]}")
  if d % 16:
    raise ValueError(f"query head dim must be a multiple of 16 (NVFP4 blocks), got {d}")
  if key.shape[2] == 0 or n % key.shape[2]:
    raise ValueError(f"query heads ({n}) must be a multiple of key/value heads ({key.shape[2]})")
  if block_n <= 0 or block_n % 16:
    raise ValueError(f"block_n must be a positive multiple of 16, got {block_n}")
  dispatch.check_implementation(implementation)


def _scale(scale, d):
  return 1.0 / math.sqrt(d) if scale is None else float(scale)


def attention_forward(query, key, value, *, scale=None, is_causal=False, implementation=None,
                      block_n=DEFAULT_BLOCK_N, config: QATConfig = QATConfig()):
  """The explicit QAT forward.

  query: [B, Tq, N, D]; key, value: [B, Tk, K, D] with N % K == 0; bf16 (fp16/fp32 accepted).
  Returns ``(out [B, Tq, N, D], out_high_precision [B, Tq, N, D], lse [B, N, Tq] fp32)``:
  O uses the quantized probabilities, O' the BF16 ones (for the backward's delta),
  lse is the natural-log softmax statistic (-inf for a row that sees no key).
  """
  _check(query, key, value, block_n, implementation)
  impl = dispatch.resolve(implementation)
  kw = dict(scale=_scale(scale, query.shape[-1]), is_causal=bool(is_causal), block_n=int(block_n), cfg=config)
  if impl == "triton":
    from jqat._src import attention_triton
    return attention_triton.forward(query, key, value, **kw)
  return reference.forward(query, key, value, **kw)


def attention_backward(d_out, query, key, value, out_for_delta, lse, *, scale=None, is_causal=False,
                       implementation=None, config: QATConfig = QATConfig()):
  """The explicit QAT backward: ``(dQ, dK, dV)`` from SPEC section 3.

  d_out, out_for_delta: [B, Tq, N, D]; query [B, Tq, N, D]; key, value [B, Tk, K, D];
  lse: [B, N, Tq] fp32. ``out_for_delta`` is O' from :func:`attention_forward`
  (or O, for the paper's "naive FP4 forward + BF16 backward" ablation).
  """
  _check(query, key, value, DEFAULT_BLOCK_N, implementation)
  for name, x in (("d_out", d_out), ("out_for_delta", out_for_delta)):
    if x.shape != query.shape:
      raise ValueError(f"{name} must have the shape of query {query.shape}, got {x.shape}")
  want = (query.shape[0], query.shape[2], query.shape[1])
  if lse.shape != want or lse.dtype != jnp.float32:
    raise ValueError(f"lse must be float32 of shape {want} [B, N, Tq], got {lse.dtype} {lse.shape}")
  impl = dispatch.resolve(implementation)
  kw = dict(scale=_scale(scale, query.shape[-1]), is_causal=bool(is_causal), cfg=config)
  if impl == "triton":
    from jqat._src import attention_triton
    return attention_triton.backward(d_out, query, key, value, out_for_delta, lse, **kw)
  return reference.backward(d_out, query, key, value, out_for_delta, lse, **kw)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _attention(query, key, value, scale, is_causal, implementation, block_n, config):
  out, _, _ = attention_forward(query, key, value, scale=scale, is_causal=is_causal,
                                implementation=implementation, block_n=block_n, config=config)
  return out


def _attention_fwd(query, key, value, scale, is_causal, implementation, block_n, config):
  out, out_hp, lse = attention_forward(query, key, value, scale=scale, is_causal=is_causal,
                                       implementation=implementation, block_n=block_n, config=config)
  # The softmax-gradient term must use O' (P @ V_hat); O = fq(P) @ V_hat only for the ablation.
  return out, (query, key, value, out_hp if config.high_precision_delta else out, lse)


def _attention_bwd(scale, is_causal, implementation, block_n, config, res, d_out):
  query, key, value, out_for_delta, lse = res
  return attention_backward(d_out, query, key, value, out_for_delta, lse, scale=scale, is_causal=is_causal,
                            implementation=implementation, config=config)


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(query, key, value, *, scale=None, is_causal=False, implementation=None, block_n=DEFAULT_BLOCK_N,
              quantize_qkv=True, quantize_p=True, high_precision_delta=True, quantize_p_backward=True):
  """NVFP4 quantization-aware-training attention (Attn-QAT), differentiable.

  query: [B, Tq, N, D]; key, value: [B, Tk, K, D] (N % K == 0 for GQA/MQA; D % 16 == 0); bf16.
  scale: softmax scale, default 1/sqrt(D). is_causal: top-left aligned causal mask.
  implementation: None (Triton on a supported GPU, else XLA), "triton" or "xla".
  block_n: KV tile size of the forward (the quantized P depends on it; both
    implementations use the same value).
  The four switches reproduce the paper's ablations; all False is BF16 flash attention.
  Returns out: [B, Tq, N, D] in the query dtype. Gradients are straight-through
  for Q, K, V and follow SPEC section 3.
  """
  config = QATConfig(bool(quantize_qkv), bool(quantize_p), bool(high_precision_delta), bool(quantize_p_backward))
  _check(query, key, value, block_n, implementation)
  d = query.shape[-1]
  return _attention(query, key, value, _scale(scale, d), bool(is_causal), implementation, int(block_n), config)
