"""Flax integration: an ``attention_fn`` for ``flax.nnx.MultiHeadAttention`` and
``flax.linen.MultiHeadDotProductAttention``.

    import jqat.flax
    attn = nnx.MultiHeadAttention(num_heads=4, in_features=256, dtype=jnp.bfloat16,
                                  attention_fn=jqat.flax.make_attention_fn(is_causal=True),
                                  decode=False, rngs=nnx.Rngs(0))

A flax mask ``[batch..., heads or 1, Tq, Tk]`` (bool or 0/1, the same for every head) is
mapped onto the kernels' masks: every mask of the form

    visible[i, j] = (a[i] == c[j]) and causal(i, j)

for some labels ``a``, ``c`` (no mask; padding masks and segment masks from
``flax.nnx.make_attention_mask``; the decode cache mask of ``MultiHeadAttention(decode=True)``)
and ``causal`` the top-left or bottom-right causal mask or none. Labels are read from the mask:
row ``i`` gets the index of its first visible key, key ``j`` the label of the rows that see it.

* A concrete mask (outside ``jit``) is checked on the host: a padding mask becomes
  ``query_seq_lengths`` / ``key_value_seq_lengths``, other label structures segment ids,
  and anything else raises a ``ValueError`` that names what is supported.
* A traced mask (inside ``jit``) cannot be checked while tracing. Its labels are computed on
  the device, with the causal part chosen on the device (``lax.cond``) unless it is static
  (``is_causal`` of the call or of the factory), and the rebuilt mask is compared with the
  given one: a batch element whose mask has no such structure gets NaN outputs, never a
  silently wrong attention.

``bias``, dropout during training and ``sow_weights`` (which needs the
attention matrix that the kernels never materialize) are rejected with a
``ValueError``. ``precision`` is ignored: the numerics are fixed (docs/NUMERICS.md, sections 4-7).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jqat._src import dispatch, validate
from jqat._src.attention import attention
from jqat.ffi import options

__all__ = ["FACTORY_OPTIONS", "PackedKVCache", "attention_fn", "make_attention_fn"]

_SUPPORTED = ("no mask, the causal mask (top-left or bottom-right), padding masks, segment masks from "
              "flax.nnx.make_attention_mask(segment_ids, segment_ids, jnp.equal), the decode cache mask, and "
              "any of these combined with the causal mask")


def _causal(tq: int, tk: int, alignment):
  """[Tq, Tk] causal mask (NumPy, static), or None for no causal part."""
  if alignment is None:
    return None
  offset = tk - tq if alignment == "bottom_right" else 0
  return np.arange(tk)[None, :] <= np.arange(tq)[:, None] + offset


def _labels(visible, alignment, xp):
  """Labels ``(a [Bf, Tq], c [Bf, Tk])`` read from ``visible: [Bf, Tq, Tk]`` bool, and whether
  ``(a[i] == c[j]) & causal`` rebuilds ``visible`` exactly (``ok [Bf]``).

  Rows that see nothing get -1, keys no row sees -2: neither matches anything. xp: NumPy for a
  concrete mask (checked on the host, even inside a trace), jax.numpy for a traced one.
  """
  tq, tk = visible.shape[-2:]
  a = xp.where(visible.any(-1), xp.argmax(visible, axis=-1), -1).astype(np.int32)
  c = xp.max(xp.where(visible, a[:, :, None], -1), axis=1, initial=-1)
  c = xp.where(c < 0, -2, c).astype(np.int32)
  rebuilt = a[:, :, None] == c[:, None, :]
  causal = _causal(tq, tk, alignment)
  if causal is not None:
    rebuilt = rebuilt & causal
  return a, c, xp.all(rebuilt == visible, axis=(1, 2))


def _flat_mask(mask, batch, tq: int, tk: int, xp):
  """The mask as bool ``[prod(batch), Tq, Tk]`` and whether it is the same for every head (``[Bf]``)."""
  shape = tuple(np.shape(mask))
  if (len(shape) < 2 or any(s not in (1, want) for s, want in zip(shape[-2:], (tq, tk)))
      or len(shape) > len(batch) + 3):
    raise ValueError(f"mask must broadcast to [batch..., heads, Tq={tq}, Tk={tk}], got shape {shape}")
  m = xp.asarray(mask) != 0
  m = m.reshape((1,) * (len(batch) + 3 - len(shape)) + shape)
  m = xp.broadcast_to(m, batch + m.shape[-3:-2] + (tq, tk)).reshape((math.prod(batch), -1, tq, tk))
  return m.any(1), xp.all(m.any(1) == m.all(1), axis=(1, 2))


def _as_lengths(a, c):
  """Padding masks as ``(query_seq_lengths, key_value_seq_lengths)`` (NumPy), or None when not padding.

  Padding: every live row and live key share one label, and they are prefixes.
  """
  rows, keys = a >= 0, c >= 0
  q_len, kv_len = rows.sum(1), keys.sum(1)
  prefix = lambda live, n: (live == (np.arange(live.shape[1])[None, :] < n[:, None])).all()
  one = lambda lab, live: (np.where(live, lab, 0) == np.where(live, lab, 0).max(1, keepdims=True)).all()
  if prefix(rows, q_len) and prefix(keys, kv_len) and one(a, rows) and one(c, keys):
    return q_len.astype(np.int32), kv_len.astype(np.int32)
  return None


# The options a call takes from its module's mask (causality and its alignment, a window) or from flax's contract
# (the softmax scale is 1/sqrt(D), as in flax's dot_product_attention); every other option of jqat.attention is a
# keyword of the factory, so a new option in jqat.ffi.options reaches flax models with no edit here.
_PER_CALL = ("scale", "is_causal", "local_window_size", "causal_alignment")
FACTORY_OPTIONS = tuple(name for name in options.public_names() if name not in _PER_CALL)


def make_attention_fn(*, is_causal: bool = False, implementation: str | None = None, smooth_k: bool = False,
                      **attention_options):
  """Returns an ``attention_fn`` that runs :func:`jqat.attention` inside a flax attention module.

  is_causal: every call is causal, aligned bottom-right (key j visible to query i iff
    j <= i + Tk - Tq): top-left when Tq == Tk, and it hides nothing of a one-query decode
    step, whose cache mask then decides. A call's own ``is_causal=True`` is top-left, as in
    ``jax.nn.dot_product_attention``. Masks are mapped as the module docstring says.
  implementation, smooth_k and ``attention_options`` are passed to :func:`jqat.attention`. attention_options: its
    options that no call decides (:data:`FACTORY_OPTIONS`: ``block_n``, the four QAT switches, ``p_scale``
    ("block" or "row"), ``qkv_scale`` ("block" or "tensor"), docs/NUMERICS.md), checked here; all switches False
    is BF16 flash attention.
  """
  for name in attention_options:
    if name in _PER_CALL:
      raise TypeError(f"make_attention_fn does not take {name}: each call takes it from the module's mask or flax's "
                      f"attention_fn contract; the factory's options are {FACTORY_OPTIONS}")
    if name not in FACTORY_OPTIONS:
      raise TypeError(f"make_attention_fn got an unknown keyword {name!r}; it takes is_causal, implementation, "
                      f"smooth_k and the options {FACTORY_OPTIONS}")
  options.check_keywords(**attention_options)
  always_causal = validate.flag("is_causal", is_causal)
  switches = dict(implementation=implementation, smooth_k=validate.flag("smooth_k", smooth_k), **attention_options)
  dispatch.check_implementation(implementation)

  # The argument names are those flax passes (linen filters them by this signature).
  def jqat_attention_fn(query, key, value, bias=None, mask=None, broadcast_dropout=True, dropout_rng=None,
                        dropout_rate=0.0, deterministic=False, dtype=None, precision=None, module=None,
                        is_causal=False):
    """query: [batch..., Tq, N, D]; key, value: [batch..., Tk, K, D]. Returns [batch..., Tq, N, D].

    dtype: compute dtype; query, key and value are promoted to it (default: their
    common dtype), as flax's ``dot_product_attention`` does.
    """
    del broadcast_dropout, dropout_rng, precision  # no dropout is ever applied; numerics fixed (docs/NUMERICS.md)
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
    # Static causality: the call's (top-left, as jax.nn) wins over the factory's (bottom-right).
    alignment = "top_left" if is_causal else ("bottom_right" if always_causal else None)
    dtype = jnp.result_type(query, key, value) if dtype is None else dtype
    batch = query.shape[:-3]
    to_4d = lambda x: x.astype(dtype).reshape((math.prod(batch),) + x.shape[-3:])
    q, k, v = to_4d(query), to_4d(key), to_4d(value)

    def run(align, **masks):
      return attention(q, k, v, is_causal=align is not None, causal_alignment=align or "top_left", **switches,
                       **masks)

    if mask is None:
      return run(alignment).reshape(query.shape)
    try:
      mask, xp = np.asarray(mask), np
    except jax.errors.TracerArrayConversionError:
      xp = jnp
    visible, same_heads = _flat_mask(mask, batch, tq, tk, xp)
    candidates = [alignment] if alignment is not None else [None, "top_left"] + (["bottom_right"] if tq != tk else [])
    labelled = [(align, *_labels(visible, align, xp)) for align in candidates]
    if xp is jnp:
      return _traced(run, labelled, same_heads).reshape(query.shape)
    return _concrete(run, labelled, same_heads, np.shape(mask)).reshape(query.shape)

  return jqat_attention_fn


def _concrete(run, labelled, same_heads, shape):
  """The first candidate that rebuilds the (host-known) mask, as lengths when it is a padding mask."""
  for align, a, c, ok in labelled:
    if not (ok & same_heads).all():
      continue
    if (a >= 0).all() and (c == a[:, :1]).all() and (a == a[:, :1]).all():
      return run(align)  # every row sees every key (up to the causal part): no array mask
    lengths = _as_lengths(a, c)
    if lengths is not None:
      return run(align, query_seq_lengths=jnp.asarray(lengths[0]), key_value_seq_lengths=jnp.asarray(lengths[1]))
    return run(align, q_segment_ids=jnp.asarray(a), kv_segment_ids=jnp.asarray(c))
  raise ValueError(f"mask of shape {shape} cannot be expressed by the jqat kernels; supported: {_SUPPORTED}")


def _traced(run, labelled, same_heads):
  """Segment ids computed on the device and the causal part picked there (the first candidate that rebuilds the
  mask of every batch element); NaN for a batch element whose mask that candidate does not rebuild."""
  oks = jnp.stack([ok & same_heads for *_, ok in labelled])  # [candidates, Bf]
  branches = [lambda align=align, a=a, c=c: run(align, q_segment_ids=a, kv_segment_ids=c)
              for align, a, c, _ in labelled]
  pick = jnp.argmax(oks.all(axis=1))  # 0 when none fits: its bad elements become NaN below
  out = branches[0]() if len(branches) == 1 else lax.switch(pick, branches)
  return jnp.where(oks[pick][:, None, None, None], out, jnp.nan).astype(out.dtype)


attention_fn = make_attention_fn()
"""Attn-QAT attention (all switches on) for flax; masks mapped as the module docstring says."""


class PackedKVCache:
  """A packed NVFP4 KV cache as Flax nnx state, for serving a model under ``nnx.jit``.

      cache = jqat.flax.PackedKVCache(batch=8, capacity=4096, kv_heads=4, head_dim=64)   # inside an nnx.Module
      out = cache.prefill(q, k, v)        # [B, T, N, D] prompt: jqat.attention (causal), K and V written
      out = cache.decode(q, k, v)         # [B, Tq <= 64, ...] new tokens: written, then jqat.decode_attention

  Built as an ``nnx.Module`` on first use of the class (``make``), so that its ``nnx.Cache`` variables (the codes and
  scales of K and V and the per-sequence lengths) are updated in place by ``nnx.jit``. Keyword arguments of
  ``decode``/``prefill`` go to ``jqat.decode_attention`` / ``jqat.attention`` (the QAT switches, ``block_n``,
  ``num_splits``, ``implementation``). Sequences advance together: each call moves every sequence on by its number of
  tokens, so prompts of different lengths are padded to one length (ragged prefill is not supported).
  """

  def __new__(cls, batch: int, capacity: int, kv_heads: int, head_dim: int):
    return _packed_kv_cache_module()(batch, capacity, kv_heads, head_dim)


def _packed_kv_cache_module():
  global _PackedKVCacheModule
  if _PackedKVCacheModule is not None:
    return _PackedKVCacheModule
  from flax import nnx  # noqa: PLC0415  (flax is an optional dependency)

  from jqat._src import decode as _decode  # noqa: PLC0415

  class PackedKVCacheModule(nnx.Module):
    __doc__ = PackedKVCache.__doc__

    def __init__(self, batch: int, capacity: int, kv_heads: int, head_dim: int):
      for name, value in (("batch", batch), ("capacity", capacity), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int):
          raise TypeError(f"PackedKVCache: {name} must be a positive int, got {value!r} ({type(value).__name__})")
        if value <= 0:
          raise ValueError(f"PackedKVCache: {name} must be a positive int, got {value}")
      kc, vc = (_decode.init_kv_cache((batch, capacity, kv_heads, head_dim)) for _ in range(2))
      self.k_codes, self.k_scales = nnx.Cache(kc[0]), nnx.Cache(kc[1])
      self.v_codes, self.v_scales = nnx.Cache(vc[0]), nnx.Cache(vc[1])
      self.lengths = nnx.Cache(jnp.zeros((batch,), jnp.int32))

    def _write(self, key, value, implementation):
      tn = key.shape[1]
      positions = self.lengths[...][:, None] + jnp.arange(tn, dtype=jnp.int32)[None, :]
      (kc, ks), (vc, vs) = _decode.kv_cache_update(
          (self.k_codes[...], self.k_scales[...]), (self.v_codes[...], self.v_scales[...]), key, value, positions,
          implementation=implementation)
      self.k_codes[...], self.k_scales[...], self.v_codes[...], self.v_scales[...] = kc, ks, vc, vs
      self.lengths[...] = self.lengths[...] + tn

    def reset(self):
      """Empties every sequence (the codes stay; lengths 0 hide them)."""
      self.lengths[...] = jnp.zeros_like(self.lengths[...])

    def prefill(self, query, key, value, *, implementation=None, **attention_kwargs):
      """query [B, T, N, D], key, value [B, T, K, D] of a prompt at the start of empty sequences: writes K, V and
      returns causal ``jqat.attention`` over the prompt (the training forward, on the values the cache now holds)."""
      out = attention(query, key, value, is_causal=True, implementation=implementation, **attention_kwargs)
      self._write(key, value, implementation)
      return out

    def decode(self, query, key, value, *, implementation=None, **decode_kwargs):
      """query [B, Tq, N, D], key, value [B, Tq, K, D] of 1..64 new tokens: writes them after each sequence's
      tokens and returns ``jqat.decode_attention`` over the cache (causal among the new tokens)."""
      self._write(key, value, implementation)
      return _decode.decode_attention(query, (self.k_codes[...], self.k_scales[...]),
                                      (self.v_codes[...], self.v_scales[...]), self.lengths[...],
                                      implementation=implementation, **decode_kwargs)

  PackedKVCacheModule.__name__ = PackedKVCacheModule.__qualname__ = "PackedKVCache"
  _PackedKVCacheModule = PackedKVCacheModule
  return PackedKVCacheModule


_PackedKVCacheModule = None
