"""Serving what jqat trains: a packed NVFP4 KV cache and decode attention over it (docs/NUMERICS.md, section 10).

Shapes: B batch, Tq new query tokens (1..64), N query heads, K KV heads (N % K == 0), D head dim, T the cache's
capacity per sequence. A cache tensor is the pair ``(codes, scales)`` that ``jqat.nvfp4.quantize`` returns along
D: ``codes uint8 [B, T, K, D // 2]``, ``scales float8_e4m3fn [B, T, K, D // 16]`` (0.5625 bytes a value), or,
paged, ``[num_pages, page_size, K, ...]`` with ``page_table int32 [B, pages_per_seq]`` (page p of sequence b is
``page_table[b, p]``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jqat._src import decode_reference as reference
from jqat._src import dispatch, validate
from jqat.ffi.options import DEFAULT_BLOCK_N, check_block_n, default_num_splits

MAX_NEW_TOKENS = 64
_KERNEL_HEAD_DIMS = (32, 256)  # the decode kernel's even/odd channel tiles need D >= 32


def init_kv_cache(shape, dtype=None):
  """An empty cache tensor ``(codes, scales)`` for values of ``shape`` ``[B, T, K, D]`` (or, paged,
  ``[num_pages, page_size, K, D]``): zero codes and scales, which read as 0. ``dtype`` is accepted for symmetry
  and ignored (the storage is NVFP4)."""
  del dtype
  shape = tuple(int(s) for s in shape)
  if len(shape) != 4 or shape[-1] % 16 or shape[-1] <= 0 or min(shape) < 0:
    raise ValueError(f"init_kv_cache: shape must be [B or pages, T or page_size, K, D] with D a positive multiple "
                     f"of 16, got {shape}")
  return (jnp.zeros(shape[:-1] + (shape[-1] // 2,), jnp.uint8),
          jnp.zeros(shape[:-1] + (shape[-1] // 16,), jnp.float8_e4m3fn))


def _concrete(x):
  """``x`` as a NumPy array when its value is known (outside ``jit``), else None."""
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
    return None


def _int_array(name: str, x, shape: tuple) -> None:
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise TypeError(f"{name} must be an int32 array of shape {shape}, got {type(x).__name__}")
  if validate.dtype_name(x) not in ("int32", "int64", "int16", "int8", "uint8", "uint16", "uint32"):
    raise TypeError(f"{name} must be an int32 array of shape {shape}, got dtype {validate.dtype_name(x)}")
  if tuple(x.shape) != shape:
    raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
  value = _concrete(x)
  if value is not None and value.size and (value.min() < -(2**31) or value.max() >= 2**31):
    raise ValueError(f"{name} must fit int32, got values in [{value.min()}, {value.max()}]")


def cache_layout(k_cache, v_cache, page_table, batch: int | None, kv_heads: int | None = None,
                 head_dim: int | None = None) -> dict:
  """Checks two cache tensors and the page table; returns ``{"capacity", "kv_heads", "head_dim", "paged"}``.

  batch, kv_heads, head_dim: what the caches must hold (None: read from them)."""
  for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
    if not isinstance(cache, (tuple, list)) or len(cache) != 2:
      raise TypeError(f"{name} must be a pair (codes, scales) as jqat.nvfp4.quantize returns, got "
                      f"{type(cache).__name__}")
    codes, scales = cache
    for part, x in ((f"{name} codes", codes), (f"{name} scales", scales)):
      if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{part} must be an array, got {type(x).__name__}")
      if len(x.shape) != 4:
        raise ValueError(f"{part} must have rank 4 [B or pages, T or page_size, K, ...], got shape {tuple(x.shape)}")
    if validate.dtype_name(codes) != "uint8":
      raise TypeError(f"{name} codes must be uint8 (two E2M1 codes per byte), got {validate.dtype_name(codes)}")
    if validate.dtype_name(scales) != "float8_e4m3fn":
      raise TypeError(f"{name} scales must be float8_e4m3fn, got {validate.dtype_name(scales)}")
    d = codes.shape[3] * 2
    if tuple(scales.shape) != tuple(codes.shape[:3]) + (d // 16,) or d % 16 or d == 0:
      raise ValueError(f"{name} scales must have shape {tuple(codes.shape[:3]) + (d // 16,)} for codes of shape "
                       f"{tuple(codes.shape)} (one E4M3 scale per 16 values; D = 2 * codes.shape[-1], a positive "
                       f"multiple of 16), got {tuple(scales.shape)}")
  if tuple(v_cache[0].shape) != tuple(k_cache[0].shape):
    raise ValueError(f"v_cache must have the shape of k_cache {tuple(k_cache[0].shape)}, got "
                     f"{tuple(v_cache[0].shape)}")
  codes = k_cache[0]
  d = codes.shape[3] * 2
  if head_dim is not None and d != head_dim:
    raise ValueError(f"k_cache holds head dim {d} (codes.shape[-1] * 2), the query/new keys have {head_dim}")
  if kv_heads is not None and codes.shape[2] != kv_heads:
    raise ValueError(f"k_cache holds {codes.shape[2]} KV heads, expected {kv_heads}")
  if page_table is None:
    if batch is not None and codes.shape[0] != batch:
      raise ValueError(f"k_cache must lead with the batch ({batch}) without a page_table, got {codes.shape[0]}")
    return {"capacity": codes.shape[1], "kv_heads": codes.shape[2], "head_dim": d, "paged": False}
  if not hasattr(page_table, "shape") or len(page_table.shape) != 2:
    raise ValueError(f"page_table must be int32 [B, pages_per_seq], got {getattr(page_table, 'shape', page_table)}")
  _int_array("page_table", page_table, (batch if batch is not None else page_table.shape[0], page_table.shape[1]))
  ids = _concrete(page_table)
  if ids is not None and ids.size and (ids.min() < 0 or ids.max() >= codes.shape[0]):
    raise ValueError(f"page_table entries must be page ids in [0, {codes.shape[0]}), got values in "
                     f"[{ids.min()}, {ids.max()}]")
  return {"capacity": page_table.shape[1] * codes.shape[1], "kv_heads": codes.shape[2], "head_dim": d,
          "paged": True}


def _resolve(implementation, head_dim: int) -> str:
  lo, hi = _KERNEL_HEAD_DIMS
  unsupported = None if lo <= head_dim <= hi else f"the decode kernel takes head dims {lo}..{hi}, got {head_dim}"
  return dispatch.resolve(implementation, unsupported=unsupported)


def kv_cache_update(k_cache, v_cache, k_new, v_new, positions, *, page_table=None, implementation=None):
  """Writes new keys and values into packed NVFP4 caches; returns ``(k_cache, v_cache)``.

  k_cache, v_cache: ``(codes, scales)`` pairs (module docstring), contiguous ``[B, T, K, ..]`` or paged
    ``[num_pages, page_size, K, ..]`` with ``page_table int32 [B, pages_per_seq]``.
  k_new, v_new: [B, Tn, K, D] bf16 (fp16/fp32 accepted), quantized on write: the stored codes and scales are
    ``jqat.nvfp4.quantize(k_new)``'s bit for bit.
  positions: int32 [B, Tn], the position in its sequence of each new token (paged: position p lives in page
    ``page_table[b, p // page_size]``, row ``p % page_size``).
  implementation: None (Triton on a supported GPU, else XLA), "triton" or "xla".

  In place under ``jax.jit`` with the caches donated (``donate_argnums``): the kernels write over the cache
  buffers (the custom call aliases its outputs to them), the XLA path scatters into them; no copy of a cache
  is made. Outside ``jit`` a position outside ``[0, T)`` (paged: outside ``[0, pages_per_seq * page_size)``) or
  a page id outside ``[0, num_pages)`` raises ValueError naming it; inside ``jit``, where values are not known,
  such a row's write is dropped (the rest is written; no memory outside the caches is touched).
  """
  validate.attention_inputs(k_new, k_new, v_new, names=("k_new", "k_new", "v_new"))
  b, tn, kh, d = k_new.shape
  layout = cache_layout(k_cache, v_cache, page_table, b, kh, d)
  _int_array("positions", positions, (b, tn))
  pos = _concrete(positions)
  if pos is not None and pos.size and (pos.min() < 0 or pos.max() >= layout["capacity"]):
    raise ValueError(f"positions must be in [0, {layout['capacity']}) (the cache's capacity per sequence), got values "
                     f"in [{pos.min()}, {pos.max()}]")
  positions = jnp.asarray(positions, jnp.int32)
  table = None if page_table is None else jnp.asarray(page_table, jnp.int32)
  if _resolve(implementation, d) == "triton":
    from jqat.ffi import jax_launch  # noqa: PLC0415  (GPU only)
    return jax_launch.kv_cache_update(tuple(k_cache), tuple(v_cache), k_new, v_new, positions, table)
  return (reference.write(*k_cache, k_new, positions, table), reference.write(*v_cache, v_new, positions, table))


@jax.custom_jvp
def _not_differentiable(x):
  return x


@_not_differentiable.defjvp
def _not_differentiable_jvp(primals, tangents):
  raise NotImplementedError("jqat.decode_attention is an inference op over a quantized cache and has no derivative; "
                            "train with jqat.attention")


def decode_attention(query, k_cache, v_cache, kv_lengths, *, page_table=None, scale=None, is_causal=True,
                     num_splits=None, implementation=None, block_n=DEFAULT_BLOCK_N, quantize_qkv=True, quantize_p=True,
                     high_precision_delta=True, quantize_p_backward=True, p_scale="block"):
  """Attention of Tq new tokens over a packed NVFP4 KV cache (docs/NUMERICS.md, section 10).

  query: [B, Tq, N, D] bf16 (fp16/fp32 accepted), 1 <= Tq <= 64; its tokens must already be in the cache, at
    positions ``kv_lengths - Tq ... kv_lengths - 1`` (``kv_cache_update``).
  k_cache, v_cache: ``(codes, scales)`` pairs, contiguous or paged with ``page_table`` (module docstring).
  kv_lengths: int32 [B], the tokens of each sequence in the cache, new ones included (Tq <= length <= T). Values
    known on the host are checked; traced ones (inside ``jit``) are clamped to ``[0, T]`` and page ids outside
    ``[0, num_pages)`` into it, so a bad value reads the wrong rows of the cache, never memory outside it.
  is_causal: query i sees keys ``j <= kv_lengths - Tq + i`` (the new tokens causally among themselves); False:
    every query sees all ``kv_lengths`` keys.
  num_splits: the KV walk cut into this many runs of tiles, walked in parallel and merged by their maxima
    (flash-decoding); None picks one from the shapes alone (the same on every device and implementation); 1 is
    the training forward's walk: O is then ``jqat.attention``'s forward O on the dequantized cache.
  block_n, quantize_qkv (here: fq(Q); the cache is NVFP4 already), quantize_p, p_scale: as in
    :func:`jqat.attention` (the same function of the tiles); high_precision_delta and quantize_p_backward concern
    the backward and are accepted so a model's switches pass through unchanged.
  implementation: None (Triton on a supported GPU, else XLA), "triton" or "xla".
  Returns O: [B, Tq, N, D] in the query dtype (0 for a query that sees no key). Not differentiable.
  """
  validate.attention_inputs(query, query, query)
  b, tq, n, d = query.shape
  if not 1 <= tq <= MAX_NEW_TOKENS:
    raise ValueError(f"query must hold 1 to {MAX_NEW_TOKENS} new tokens per sequence (axis 1), got {tq}; run longer "
                     "prompts through jqat.attention (prefill) and kv_cache_update")
  layout = cache_layout(k_cache, v_cache, page_table, b, head_dim=d)
  kh = layout["kv_heads"]
  if kh == 0 or n % kh:
    raise ValueError(f"query heads ({n}) must be a multiple of the cache's KV heads ({kh})")
  _int_array("kv_lengths", kv_lengths, (b,))
  lengths = _concrete(kv_lengths)
  if lengths is not None and lengths.size and (lengths.min() < tq or lengths.max() > layout["capacity"]):
    raise ValueError(f"kv_lengths must be in [Tq={tq}, {layout['capacity']}] (the new tokens are in the cache; at most "
                     f"its capacity), got values in [{lengths.min()}, {lengths.max()}]")
  if num_splits is None:
    num_splits = default_num_splits(b, kh, layout["capacity"], check_block_n("block_n", block_n))
  opts = validate.decode_options(head_dim=d, scale=scale, is_causal=is_causal, block_n=block_n, num_splits=num_splits,
                                 quantize_qkv=quantize_qkv, quantize_p=quantize_p,
                                 high_precision_delta=high_precision_delta, quantize_p_backward=quantize_p_backward,
                                 p_scale=p_scale)
  kv_lengths = jnp.asarray(kv_lengths, jnp.int32)
  table = None if page_table is None else jnp.asarray(page_table, jnp.int32)
  query = _not_differentiable(query)
  if _resolve(implementation, d) == "triton":
    from jqat.ffi import jax_launch  # noqa: PLC0415  (GPU only)
    return jax_launch.decode_attention(query, tuple(k_cache), tuple(v_cache), kv_lengths, opts, table)
  k = reference.gather(*k_cache, table)
  v = reference.gather(*v_cache, table)
  return _reference_decode(query, k, v, kv_lengths, opts)


_reference_decode = jax.jit(reference.decode, static_argnames=("opts",))
