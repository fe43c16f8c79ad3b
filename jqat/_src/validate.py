"""The one validator of QAT attention's inputs and keywords, shared by the JAX API and the torch shim.

Works on anything with ``shape`` and ``dtype`` (JAX arrays, tracers, torch tensors), so the
checks and their messages are the same on both sides; each failure names the argument,
what was expected and what was given (docs/API.md, section 3). The op's keywords are checked by the
schema of their options (the fields of ``jqat.ffi.options.AttentionOptions``), the arrays here.
"""

from __future__ import annotations

import numpy as np

from jqat.ffi import options
from jqat.ffi.options import INT32_MAX, AttentionOptions, DecodeOptions

FLOAT_DTYPES = ("bfloat16", "float16", "float32")
INT32_MIN = -(2**31)
# The public names of the array masks, in ``jqat.ffi.options.MASK_OPERANDS`` order.
MASK_NAMES = ("query_seq_lengths", "key_value_seq_lengths", "q_segment_ids", "kv_segment_ids")


def dtype_name(x) -> str:
  return str(x.dtype).removeprefix("torch.")


def attention_inputs(query, key, value, *, layout: str = "BTNH", names=("query", "key", "value"),
                     gqa: bool = True) -> None:
  """Checks rank, dtype and shapes of query, key, value in ``layout`` "BTNH" (JAX) or "BHSD" (torch).

  gqa: query heads may be a multiple of the KV heads (else they must be equal; torch's ``enable_gqa``).
  """
  rank_text = "[B, T, heads, D]" if layout == "BTNH" else "[B, H, S, D]"
  for name, x in zip(names, (query, key, value)):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
      raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    if len(x.shape) != 4:
      raise ValueError(f"{name} must have rank 4 {rank_text}, got shape {tuple(x.shape)}")
    if dtype_name(x) not in FLOAT_DTYPES:
      raise TypeError(f"{name} must be bfloat16, float16 or float32, got {dtype_name(x)}")
  nq, nk, nv = names
  if not dtype_name(query) == dtype_name(key) == dtype_name(value):
    raise TypeError(f"{nq}, {nk} and {nv} must share a dtype, got {dtype_name(query)}, {dtype_name(key)}, "
                    f"{dtype_name(value)}")
  heads_axis = 2 if layout == "BTNH" else 1
  b, d = query.shape[0], query.shape[3]
  n, kh = query.shape[heads_axis], key.shape[heads_axis]
  if tuple(value.shape) != tuple(key.shape):
    raise ValueError(f"{nv} must have the shape of {nk} {tuple(key.shape)}, got {tuple(value.shape)}")
  if key.shape[0] != b:
    raise ValueError(f"{nk} batch must equal {nq} batch {b}, got {key.shape[0]}")
  if key.shape[3] != d:
    raise ValueError(f"{nk} head dim must equal {nq} head dim {d}, got {key.shape[3]}")
  if d % 16 or d == 0:
    raise ValueError(f"{nq} head dim must be a positive multiple of 16 (NVFP4 blocks), got {d}")
  if gqa:
    if kh == 0 and n == 0:
      return
    if kh == 0 or n % kh:
      raise ValueError(f"{nq} heads ({n}) must be a multiple of {nk}/{nv} heads ({kh})")
  elif n != kh:
    raise ValueError(f"{nq} heads ({n}) must equal {nk}/{nv} heads ({kh}); pass enable_gqa=True for GQA/MQA")


# A bool keyword that is no option of the op (smooth_k, enable_gqa): checked as the options' switches are.
flag = options.check_flag


def attention_options(*, head_dim: int, **keywords) -> AttentionOptions:
  """Validated :class:`AttentionOptions` from the public keywords: its fields by name, each checked by its own
  :class:`jqat.ffi.options.Option` (the QAT switches by their own names or as ``config``); absent ones take their
  public defaults, ``scale=None`` is ``1/sqrt(head_dim)``."""
  return options.from_keywords(AttentionOptions, head_dim=head_dim, **keywords)


def decode_options(*, head_dim: int, **keywords) -> DecodeOptions:
  """Validated :class:`DecodeOptions` from the public keywords, as :func:`attention_options` (``num_splits``
  already resolved from None by the caller: it is a function of the cache's shape)."""
  return options.from_keywords(DecodeOptions, head_dim=head_dim, **keywords)


def row_max(value, query, p_scale: str):
  """The forward's row max ``[B, N, Tq]`` fp32: required with p_scale="row", refused with "block"."""
  want = (query.shape[0], query.shape[2], query.shape[1])
  if p_scale == "block":
    if value is not None:
      raise ValueError("row_max is the p_scale='row' residual; with p_scale='block' pass row_max=None")
    return None
  if value is None:
    raise ValueError(f"p_scale='row' needs row_max, the fourth output of attention_forward (float32 {want} "
                     "[B, N, Tq]), got None")
  if not hasattr(value, "shape") or tuple(value.shape) != want or dtype_name(value) != "float32":
    raise ValueError(f"row_max must be float32 of shape {want} [B, N, Tq], got {getattr(value, 'dtype', '?')} "
                     f"{getattr(value, 'shape', value)}")
  return value


def fits_int32(name: str, values) -> None:
  """Raises unless every integer of ``values`` (a host array) lies in int32's range: the kernels and the reference
  compare lengths and segment ids as int32, and a wider value would wrap (``2**32 + 5`` read as 5)."""
  values = np.asarray(values)
  if values.size and (values.min() < INT32_MIN or values.max() > INT32_MAX):
    raise ValueError(f"{name} must hold values in int32's range [-2**31, 2**31 - 1] (they are compared as int32), "
                     f"got values in [{values.min()}, {values.max()}] ({values.dtype})")


def mask_operands(query, key, query_seq_lengths=None, key_value_seq_lengths=None, q_segment_ids=None,
                  kv_segment_ids=None, *, layout: str = "BTNH") -> tuple:
  """Checks the array masks against query [B, Tq, ...] and key [B, Tk, ...] (``layout`` as in
  :func:`attention_inputs`); returns them in ``jqat.ffi.options.MASK_OPERANDS`` order (None where absent).

  Lengths are integer [B], segment ids integer [B, Tq] and [B, Tk], given together. The caller casts them to
  int32 (values must fit: lengths and ids are compared, never used as addresses).
  """
  t_axis = 1 if layout == "BTNH" else 2
  b, tq, tk = query.shape[0], query.shape[t_axis], key.shape[t_axis]
  given = {"query_seq_lengths": (query_seq_lengths, (b,)), "key_value_seq_lengths": (key_value_seq_lengths, (b,)),
           "q_segment_ids": (q_segment_ids, (b, tq)), "kv_segment_ids": (kv_segment_ids, (b, tk))}
  for name, (x, want) in given.items():
    if x is None:
      continue
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
      raise TypeError(f"{name} must be an integer array of shape {want}, got {type(x).__name__}")
    if "int" not in dtype_name(x):
      raise TypeError(f"{name} must have an integer dtype (int32), got {dtype_name(x)}")
    if tuple(x.shape) != want:
      raise ValueError(f"{name} must have shape {want} ({'[B]' if len(want) == 1 else '[B, T]'}), got "
                       f"{tuple(x.shape)}")
  if (q_segment_ids is None) != (kv_segment_ids is None):
    raise ValueError("q_segment_ids and kv_segment_ids must be given together (a query sees only keys of its own "
                     f"segment), got only {'q_segment_ids' if kv_segment_ids is None else 'kv_segment_ids'}")
  return query_seq_lengths, key_value_seq_lengths, q_segment_ids, kv_segment_ids
