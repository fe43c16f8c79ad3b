"""The one validator of QAT attention's inputs and keywords, shared by the JAX API and the torch shim.

Works on anything with ``shape`` and ``dtype`` (JAX arrays, tracers, torch tensors), so the
checks and their messages are the same on both sides; each failure names the argument,
what was expected and what was given (docs/API.md, section 3).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from jqat.ffi.options import P_SCALES, QKV_SCALES, AttentionOptions, QATConfig

FLOAT_DTYPES = ("bfloat16", "float16", "float32")
BLOCK_N_CHOICES = (16, 32, 64, 128, 256)  # powers of two (Triton tiles) from one fq(P) block up
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
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


def flag(name: str, value) -> bool:
  """A bool keyword: Python or NumPy bools only (``"no"`` or ``"False"`` must not read as True)."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
  return bool(value)


def block_n(value) -> int:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    raise TypeError(f"block_n must be an int in {BLOCK_N_CHOICES}, got {value!r} ({type(value).__name__})")
  if int(value) not in BLOCK_N_CHOICES:
    raise ValueError(f"block_n must be one of {BLOCK_N_CHOICES} (a power of two, a multiple of the 16-key fq(P) "
                     f"block), got {value}")
  return int(value)


def scale(value, head_dim: int) -> float:
  """The softmax scale: ``None`` gives ``1/sqrt(head_dim)``; else a finite real number."""
  if value is None:
    return 1.0 / math.sqrt(head_dim) if head_dim else 1.0
  if isinstance(value, (bool, np.bool_, str, bytes)):
    raise TypeError(f"scale must be None or a real number, got {value!r} ({type(value).__name__})")
  if not isinstance(value, numbers.Real):
    try:
      value = float(value)  # a concrete 0-d array
    except (TypeError, ValueError):
      raise TypeError(f"scale must be None or a real number (static, not traced), got {type(value).__name__}") \
          from None
  if not math.isfinite(float(value)):
    raise ValueError(f"scale must be finite, got {value}")
  return float(value)


def p_scale(value, name: str = "p_scale") -> str:
  if not isinstance(value, str) or value not in P_SCALES:
    raise ValueError(f"{name} must be one of {P_SCALES} (docs/NUMERICS.md), got {value!r}")
  return value


def qat_config(quantize_qkv, quantize_p, high_precision_delta, quantize_p_backward) -> QATConfig:
  return QATConfig(flag("quantize_qkv", quantize_qkv), flag("quantize_p", quantize_p),
                   flag("high_precision_delta", high_precision_delta), flag("quantize_p_backward", quantize_p_backward))


def qkv_scale(value) -> str:
  if not isinstance(value, str) or value not in QKV_SCALES:
    raise ValueError(f"qkv_scale must be one of {QKV_SCALES} (docs/NUMERICS.md), got {value!r}")
  return value


def row_max(value, query, p_scale_value: str):
  """The forward's row max ``[B, N, Tq]`` fp32: required with p_scale="row", refused with "block"."""
  want = (query.shape[0], query.shape[2], query.shape[1])
  if p_scale_value == "block":
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


CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def _count(name: str, value) -> int:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 0:
    raise TypeError(f"{name} must be a non-negative int, got {value!r} ({type(value).__name__})")
  return int(value)


def _window_side(name: str, value) -> int:
  """A window side: a non-negative int that the kernels' 32-bit index arithmetic holds (a side of 2**31 or more
  would wrap there; any side of Tq + Tk or more already leaves that side unbounded)."""
  value = _count(name, value)
  if value > INT32_MAX:
    raise ValueError(f"{name} must be at most 2**31 - 1 = {INT32_MAX} (a side at least Tq + Tk already hides "
                     f"nothing), got {value}")
  return value


def local_window_size(value) -> tuple[int, int] | None:
  """None, an int ``w`` (the window ``(w, w)``, as in ``jax.nn.dot_product_attention``) or ``(left, right)``."""
  if value is None:
    return None
  if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
    return (_window_side("local_window_size", value),) * 2
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise TypeError(f"local_window_size must be None, a non-negative int or a pair (left, right) of them, got "
                    f"{value!r}")
  return (_window_side("local_window_size[0] (left)", value[0]),
          _window_side("local_window_size[1] (right)", value[1]))


def fits_int32(name: str, values) -> None:
  """Raises unless every integer of ``values`` (a host array) lies in int32's range: the kernels and the reference
  compare lengths and segment ids as int32, and a wider value would wrap (``2**32 + 5`` read as 5)."""
  values = np.asarray(values)
  if values.size and (values.min() < INT32_MIN or values.max() > INT32_MAX):
    raise ValueError(f"{name} must hold values in int32's range [-2**31, 2**31 - 1] (they are compared as int32), "
                     f"got values in [{values.min()}, {values.max()}] ({values.dtype})")


def causal_alignment(value) -> str:
  if not isinstance(value, str) or value not in CAUSAL_ALIGNMENTS:
    raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}, got {value!r}")
  return value


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


def attention_options(*, scale_value, is_causal, block_n_value, head_dim: int, config, local_window_size_value=None,
                      causal_alignment_value="top_left", p_scale_value="block",
                      qkv_scale_value="block") -> AttentionOptions:
  """Validated :class:`AttentionOptions` from the public keywords."""
  if not isinstance(config, QATConfig):
    raise TypeError(f"config must be a jqat.QATConfig, got {type(config).__name__}")
  for f in ("quantize_qkv", "quantize_p", "high_precision_delta", "quantize_p_backward"):
    flag(f"config.{f}", getattr(config, f))
  return AttentionOptions(scale(scale_value, head_dim), flag("is_causal", is_causal), block_n(block_n_value), config,
                          local_window_size(local_window_size_value), causal_alignment(causal_alignment_value),
                          p_scale(p_scale_value), qkv_scale(qkv_scale_value))
