"""Flax integration: an ``attention_fn`` for ``flax.nnx.MultiHeadAttention`` and
``flax.linen.MultiHeadDotProductAttention``.

    import jqat.flax
    attn = nnx.MultiHeadAttention(num_heads=4, in_features=256, dtype=jnp.bfloat16,
                                  attention_fn=jqat.flax.make_attention_fn(is_causal=True),
                                  decode=False, rngs=nnx.Rngs(0))

The kernels express exactly two masks: none, and top-left aligned causal. A
flax mask is mapped onto one of them:

* ``mask=None`` -> non-causal (or causal when the factory or the call says so);
* a concrete mask (outside ``jit``) is inspected: all-true -> no mask,
  lower-triangular (``make_causal_mask``) -> causal, anything else -> ``ValueError``;
* a traced mask (inside ``jit``) cannot be inspected: it is accepted only when
  the factory was built with ``is_causal=True``, which promises that every mask
  the function receives is the causal mask. Otherwise -> ``ValueError``.

``bias``, dropout during training and ``sow_weights`` (which needs the
attention matrix that the kernels never materialize) are rejected with a
``ValueError``. ``precision`` is ignored: the numerics are fixed by SPEC section 3.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ffi.options import DEFAULT_BLOCK_N
from jqat._src.attention import attention

__all__ = ["attention_fn", "make_attention_fn"]


def _mask_is_causal(mask, tq: int, tk: int, trust_traced: bool) -> bool:
  """Maps a flax mask ``[batch..., heads or 1, Tq, Tk]`` (bool or 0/1) onto the kernels' masks.

  Returns True for the causal mask, False for an all-visible one; raises for
  anything the kernels cannot express. A traced mask is taken to be causal only
  when ``trust_traced`` (the factory's promise), since its values are unknown.
  """
  shape = tuple(np.shape(mask))
  if len(shape) < 2 or any(s not in (1, want) for s, want in zip(shape[-2:], (tq, tk))):
    raise ValueError(f"mask must broadcast to [..., Tq={tq}, Tk={tk}], got shape {shape}")
  try:
    visible = np.asarray(mask) != 0
  except jax.errors.TracerArrayConversionError:
    if trust_traced:
      return True
    raise ValueError(
        "jqat attention_fn got a traced mask (inside jit) and cannot check its values; the kernels only "
        "support no mask or the causal mask. For causal self-attention build the function with "
        "jqat.flax.make_attention_fn(is_causal=True) (a traced mask is then taken to be causal), or pass "
        "mask=None with is_causal=True to nnx.MultiHeadAttention.") from None
  visible = np.broadcast_to(visible, shape[:-2] + (tq, tk))
  if visible.all():
    return False
  causal = np.tril(np.ones((tq, tk), bool))  # key j visible to query i iff j <= i (top-left aligned)
  if (visible == causal).all():
    return True
  raise ValueError(
      f"mask of shape {shape} is neither all-true nor the causal (lower-triangular) mask; the jqat "
      "kernels support only no mask or top-left aligned causal masking (padding, sliding-window and decode-cache masks are not supported)")


def make_attention_fn(*, is_causal: bool = False, implementation: str | None = None,
                      block_n: int = DEFAULT_BLOCK_N, quantize_qkv: bool = True, quantize_p: bool = True,
                      high_precision_delta: bool = True, quantize_p_backward: bool = True):
  """Returns an ``attention_fn`` that runs :func:`jqat.attention` inside a flax attention module.

  is_causal: every call is causal, and a traced mask is taken to be the causal
    mask (needed under ``jit`` with ``make_causal_mask``; a concrete mask is still
    checked). implementation, block_n and the four QAT switches are passed to
    :func:`jqat.attention`; all switches False is BF16 flash attention.
  """
  for name, value in (("quantize_qkv", quantize_qkv), ("quantize_p", quantize_p),
                      ("high_precision_delta", high_precision_delta),
                      ("quantize_p_backward", quantize_p_backward), ("is_causal", is_causal)):
    if not isinstance(value, (bool, np.bool_)):
      raise TypeError(f"{name} must be a bool, got {value!r}")
  always_causal = bool(is_causal)
  switches = dict(implementation=implementation, block_n=block_n, quantize_qkv=quantize_qkv,
                  quantize_p=quantize_p, high_precision_delta=high_precision_delta,
                  quantize_p_backward=quantize_p_backward)

  # The argument names are those flax passes (linen filters them by this signature).
  def jqat_attention_fn(query, key, value, bias=None, mask=None, broadcast_dropout=True, dropout_rng=None,
                        dropout_rate=0.0, deterministic=False, dtype=None, precision=None, module=None,
                        is_causal=False):
    """query: [batch..., Tq, N, D]; key, value: [batch..., Tk, K, D]. Returns [batch..., Tq, N, D].

    dtype: compute dtype; query, key and value are promoted to it (default: their
    common dtype), as flax's ``dot_product_attention`` does.
    """
    del broadcast_dropout, dropout_rng, precision  # no dropout is ever applied; numerics fixed by the spec
    if bias is not None:
      raise ValueError("jqat attention_fn does not support an attention bias (got bias of shape "
                       f"{np.shape(bias)}); the kernels add no bias to the logits")
    if dropout_rate > 0.0 and not deterministic:
      raise ValueError(f"jqat attention_fn does not support attention dropout (dropout_rate={dropout_rate}, "
                       "deterministic=False); set dropout_rate=0.0 or deterministic=True")
    if module is not None:
      raise ValueError("jqat attention_fn cannot sow attention weights (sow_weights=True): the kernels "
                       "never materialize the attention matrix")
    if query.ndim < 3 or query.ndim != key.ndim or key.ndim != value.ndim:
      raise ValueError(f"query, key, value must share a rank >= 3 [batch..., T, heads, D], got shapes "
                       f"{query.shape}, {key.shape}, {value.shape}")
    tq, tk = query.shape[-3], key.shape[-3]
    causal = always_causal or bool(is_causal)
    # Like jax.nn.dot_product_attention, mask and is_causal combine: an all-true mask keeps `causal`.
    if mask is not None and _mask_is_causal(mask, tq, tk, always_causal):
      causal = True
    dtype = jnp.result_type(query, key, value) if dtype is None else dtype
    batch = query.shape[:-3]
    to_4d = lambda x: x.astype(dtype).reshape((math.prod(batch),) + x.shape[-3:])
    out = attention(to_4d(query), to_4d(key), to_4d(value), is_causal=causal, **switches)
    return out.reshape(query.shape)

  return jqat_attention_fn


attention_fn = make_attention_fn()
"""Attn-QAT attention (all switches on) for flax; non-causal unless the mask or ``is_causal`` says so."""
