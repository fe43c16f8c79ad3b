"""The options of QAT attention: one frozen, hashable value passed from the public API down to the plan, and the one
schema that says what each option is.

Framework-free. :class:`QATConfig` holds the paper's four switches; :class:`AttentionOptions` everything static
that decides what the kernels compute. Each field carries an :class:`Option` (its public default, its check, its
doc), and everything that handles options is driven from the fields:

- the validator of the public keywords, :func:`from_keywords` (``jqat._src.validate.attention_options``);
- the static arguments of the torch ops, :func:`scalar_fields` / :func:`to_scalars` / :func:`from_scalars`
  (``jqat.torch._attention`` builds its op schemas from them);
- the keywords of the Flax factory (``jqat.flax.make_attention_fn``).

A new option, or a new allowed value of one, is an edit of its field here (plus the plan and kernels that implement
it, and the public signatures that name it). Below the public entry points nothing re-checks or re-packs options:
the launch plan (``jqat.ffi.plan``) unpacks them into kernel constexprs in one place.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import textwrap
from collections.abc import Callable

import numpy as np

DEFAULT_BLOCK_N = 64  # KV tile of the forward; part of the function (fq(P) depends on the running max per tile)
BLOCK_N_CHOICES = (16, 32, 64, 128, 256)  # powers of two (Triton tiles) from one fq(P) block up
P_SCALES = ("block", "row")
QKV_SCALES = ("block", "tensor")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
INT32_MAX = 2**31 - 1
MAX_SPLITS = 128  # the most runs of KV tiles a decode walk is cut into
# p_scale="row": probabilities in [0, 1] are multiplied by this before fq, so a row's maximum (1) maps to
# E2M1's 6 times E4M3's 448, the top of NVFP4's range (docs/NUMERICS.md). qkv_scale="tensor" maps each
# (batch, head) amax of Q, K, V to the same value.
P_ROW_RANGE = 6.0 * 448.0


# ----------------------------------------------------------------------------- checks
# Each takes the public name and the given value and returns the canonical value, or raises naming the argument
# (TypeError for a wrong type, ValueError for a wrong value; docs/API.md, section 3).

def check_flag(name: str, value) -> bool:
  """A bool keyword: Python or NumPy bools only (``"no"`` or ``"False"`` must not read as True)."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
  return bool(value)


def check_block_n(name: str, value) -> int:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be an int in {BLOCK_N_CHOICES}, got {value!r} ({type(value).__name__})")
  if int(value) not in BLOCK_N_CHOICES:
    raise ValueError(f"{name} must be one of {BLOCK_N_CHOICES} (a power of two, a multiple of the 16-key fq(P) "
                     f"block), got {value}")
  return int(value)


def check_scale(name: str, value) -> float | None:
  """None (``1/sqrt(D)``, resolved by :func:`from_keywords`) or a finite real number (a concrete 0-d array too)."""
  if value is None:
    return None
  if isinstance(value, (bool, np.bool_, str, bytes)):
    raise TypeError(f"{name} must be None or a real number, got {value!r} ({type(value).__name__})")
  if not isinstance(value, numbers.Real):
    try:
      value = float(value)
    except (TypeError, ValueError):
      raise TypeError(f"{name} must be None or a real number (static, not traced), got {type(value).__name__}") \
          from None
  if not math.isfinite(float(value)):
    raise ValueError(f"{name} must be finite, got {value}")
  return float(value)


def default_scale(head_dim: int) -> float:
  return 1.0 / math.sqrt(head_dim) if head_dim else 1.0


def _window_side(name: str, value) -> int:
  """A non-negative int that the kernels' 32-bit index arithmetic holds (a side of 2**31 or more would wrap there;
  any side of Tq + Tk or more already leaves that side unbounded)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be a non-negative int, got {value!r} ({type(value).__name__})")
  if value < 0:
    raise ValueError(f"{name} must be a non-negative int, got {value}")
  if value > INT32_MAX:
    raise ValueError(f"{name} must be at most 2**31 - 1 = {INT32_MAX} (a side at least Tq + Tk already hides "
                     f"nothing), got {value}")
  return int(value)


def check_window(name: str, value) -> tuple[int, int] | None:
  """None, an int ``w`` (the window ``(w, w)``, as in ``jax.nn.dot_product_attention``) or ``(left, right)``."""
  if value is None:
    return None
  if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
    return (_window_side(name, value),) * 2
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise TypeError(f"{name} must be None, a non-negative int or a pair (left, right) of them, got {value!r}")
  return _window_side(f"{name}[0] (left)", value[0]), _window_side(f"{name}[1] (right)", value[1])


def check_config(name: str, value) -> QATConfig:
  if not isinstance(value, QATConfig):
    raise TypeError(f"{name} must be a jqat.QATConfig, got {type(value).__name__}")
  for field, opt, _ in QATConfig._schema:
    opt.check(f"{name}.{field}", getattr(value, field))
  return value


# ----------------------------------------------------------------------------- the schema

@dataclasses.dataclass(frozen=True)
class Option:
  """What one option is; its public keyword is the field's name.

  default: the public default (None for ``scale``, meaning ``1/sqrt(D)``, and for ``num_splits``, a function of the
  shapes). check: ``(name, value) -> canonical value``. choices: the allowed values of a string option (then the
  check is "one of them"). doc: what it means.
  scalars: how it travels where only bool/int/float/str can (a torch op's schema): ``((name, type), ...)`` with
  ``encode(value) -> tuple`` and ``decode(*scalars) -> value``; None for a field that is one scalar of its own name.
  """

  default: object
  check: Callable[[str, object], object]
  doc: str
  choices: tuple | None = None
  scalars: tuple[tuple[str, type], ...] | None = None
  encode: Callable | None = None
  decode: Callable | None = None


_OPTION = "jqat.option"


def option(default, doc: str, *, check=None, choices=None, see: str = "", resolved=False,
           field_default=dataclasses.MISSING, **scalars):
  """A dataclass field carrying its :class:`Option`. choices: the check is "one of them" (its message points to
  ``see``). resolved: the public default (None) is resolved from the shapes before the dataclass is built, whose
  own default is then ``field_default`` (none if not given); else the dataclass's default is ``default``."""
  if choices is not None:
    check = _one_of(choices, f" ({see})" if see else "")
  meta = {_OPTION: Option(default, check, doc, choices, **scalars)}
  if not resolved:
    field_default = default
  if field_default is dataclasses.MISSING:
    return dataclasses.field(metadata=meta)
  return dataclasses.field(default=field_default, metadata=meta)


def _one_of(choices: tuple, where: str = "") -> Callable[[str, object], str]:
  def check(name: str, value) -> str:
    if not isinstance(value, str) or value not in choices:
      raise ValueError(f"{name} must be one of {choices}{where}, got {value!r}")
    return value
  return check


def _option(f: dataclasses.Field) -> Option:
  return f.metadata[_OPTION]


_SCALAR_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _with_schema(cls):
  """Records ``cls``'s options once, at import: ``cls._schema``, ``(name, Option, scalar type or None)`` per field,
  and ``cls._public_names``; the functions below read these, never ``dataclasses.fields`` (torch.compile traces
  the torch binding's validation, and dynamo cannot trace ``fields`` of a class). The fields' docs are appended
  to the class docstring, for ``help``."""
  cls._schema = tuple((f.name, _option(f), _SCALAR_TYPES.get(f.type)) for f in dataclasses.fields(cls))
  names = []
  for name, opt, _ in cls._schema:  # the nested switches are public by their own names
    names += [n for n, _, _ in QATConfig._schema] if opt.check is check_config else [name]
  cls._public_names = tuple(names)
  cls.__doc__ = cls.__doc__.rstrip() + "\n\n  Fields (public default: meaning):\n\n" + "\n".join(
      textwrap.fill(f"{name} ({opt.default!r}): {opt.doc}", 116, initial_indent="  ", subsequent_indent="    ")
      for name, opt, _ in cls._schema)
  return cls


@_with_schema
@dataclasses.dataclass(frozen=True)
class QATConfig:
  """The paper's switches; all True is Attn-QAT, all False is plain BF16 flash attention."""

  quantize_qkv: bool = option(True, "fake-quantize Q, K, V (blocks of 16 along D)", check=check_flag)
  quantize_p: bool = option(True, "fake-quantize P for the forward output O", check=check_flag)
  high_precision_delta: bool = option(
      True, "delta = rowsum(O' * dO); False uses O (naive FP4 forward + BF16 backward)", check=check_flag)
  quantize_p_backward: bool = option(True, "dV = fq(P)^T dO; False uses bf16(P)", check=check_flag)


def _encode_window(window):
  return (-1, -1) if window is None else window


def _decode_window(left: int, right: int):
  return None if left < 0 else (left, right)


@_with_schema
@dataclasses.dataclass(frozen=True)
class AttentionOptions:
  """Everything static about one QAT attention call (docs/NUMERICS.md, sections 4-7): each field's :class:`Option`
  says what it means, its public default and its check.

  The array masks (lengths, segment ids) are operands, not options: see :data:`MASK_OPERANDS`.
  """

  scale: float = option(None, "the softmax scale (public default None: 1/sqrt(D); here always resolved)",
                        check=check_scale, resolved=True)
  is_causal: bool = option(False, "causal mask, key j visible to query i iff j <= i + offset", check=check_flag)
  block_n: int = option(DEFAULT_BLOCK_N, f"KV tile of the forward, one of {BLOCK_N_CHOICES} (fq(P) depends on it)",
                        check=check_block_n)
  config: QATConfig = option(QATConfig(), "the paper's switches (public: config= or the four switch keywords)",
                             check=check_config)
  local_window_size: tuple[int, int] | None = option(
      None, "(left, right): key j visible to query i iff i + offset - left <= j <= i + offset + right "
      "(jax.nn.dot_product_attention's window; an int w is (w, w)); None for no window; ANDed with is_causal",
      check=check_window, scalars=(("window_left", int), ("window_right", int)), encode=_encode_window,
      decode=_decode_window)
  causal_alignment: str = option(
      "top_left", "where the diagonal of the causal mask and the window sits when Tq != Tk: 'top_left' "
      "(offset 0, as in JAX) or 'bottom_right' (offset Tk - Tq: the last query sees the last key, as in chunked "
      "prefill)", choices=CAUSAL_ALIGNMENTS)
  p_scale: str = option(
      "block", "how fq(P) is scaled (docs/NUMERICS.md, section 7.1): 'block' = E4M3 scales per 16 only; 'row' = "
      "two-level, fq(P_ROW_RANGE * exp(S - m)) with m the row max; the forward's final m is an extra output "
      "(row_max) that the backward reads. (Not in QATConfig, whose fields are the paper's boolean switches.)",
      choices=P_SCALES, see="docs/NUMERICS.md")
  qkv_scale: str = option(
      "block", "'block' (fq(Q), fq(K), fq(V) with E4M3 block scales only) or 'tensor' (two-level: an FP32 scale "
      "per (batch, head) above them, docs/NUMERICS.md); in the kernels 'tensor' adds the launches of "
      "plan._two_level_inputs", choices=QKV_SCALES, see="docs/NUMERICS.md")


def public_names(cls=AttentionOptions) -> tuple[str, ...]:
  """The public keywords of ``cls``'s options in field order, the paper's switches by QATConfig's field names (as
  ``jqat.attention`` and ``jqat.torch.attention`` take them; :func:`from_keywords` also takes ``config=``)."""
  return cls._public_names


def from_keywords(cls=AttentionOptions, *, head_dim: int, **keywords):
  """The validated ``cls`` from public keywords (absent ones take their public default).

  The paper's switches come either as ``config`` (a :class:`QATConfig`) or as its four field names, not both.
  ``scale=None`` resolves to ``1/sqrt(head_dim)``. Unknown keywords raise TypeError naming them."""
  return cls(**check_keywords(cls, head_dim=head_dim, **keywords))


def check_keywords(cls=AttentionOptions, *, head_dim: int | None = None, _config_as_dict: bool = False,
                   **keywords) -> dict:
  """:func:`from_keywords`'s canonical values as a dict of ``cls``'s fields, for a caller that checks keywords
  before the shapes are known (``head_dim=None``: ``scale`` is left unresolved). ``_config_as_dict``: the switches
  as a dict instead of a :class:`QATConfig` (:func:`keyword_scalars`)."""
  unknown = [name for name in keywords if name not in cls._public_names and name != "config"]
  if unknown:
    raise TypeError(f"unknown option(s) {unknown}; the options are {cls._public_names} (or config=)")
  switches = [name for name, _, _ in QATConfig._schema if name in keywords]
  if switches and "config" in keywords:
    raise TypeError(f"pass the QAT switches either as config= or by their names, not both (got config and "
                    f"{switches})")
  values = {}
  for name, opt, _ in cls._schema:
    if opt.check is check_config and "config" not in keywords:
      switches = {n: o.check(n, keywords.get(n, o.default)) for n, o, _ in QATConfig._schema}
      values[name] = switches if _config_as_dict else QATConfig(**switches)
    else:
      values[name] = opt.check(name, keywords.get(name, opt.default))
  if head_dim is not None and values.get("scale", 0.0) is None:
    values["scale"] = default_scale(head_dim)
  return values


def scalar_fields(cls=AttentionOptions) -> tuple[tuple[str, type], ...]:
  """``cls`` as ``(name, type)`` scalars (bool, int, float, str), in field order: the static arguments of an op
  whose schema holds no tuples, dataclasses or optional ints (torch.library). QATConfig travels as its switches."""
  out = []
  for name, opt, kind in cls._schema:
    if opt.check is check_config:
      out += scalar_fields(QATConfig)
    else:
      out += opt.scalars or [(name, kind)]
  return tuple(out)


def to_scalars(opts) -> tuple:
  """``opts`` as the values of :func:`scalar_fields` (plain Python bool/int/float/str)."""
  return _encode(type(opts), {name: getattr(opts, name) for name, _, _ in opts._schema})


def keyword_scalars(cls=AttentionOptions, *, head_dim: int, **keywords) -> tuple:
  """``to_scalars(from_keywords(cls, ...))`` without building the dataclasses: the torch binding checks its
  keywords inside code that ``torch.compile`` traces, and not every torch release can trace the construction of a
  frozen dataclass that holds another one."""
  values = check_keywords(cls, head_dim=head_dim, _config_as_dict=True, **keywords)
  return _encode(cls, values)


def _encode(cls, values: dict) -> tuple:
  out = []
  for name, opt, _ in cls._schema:
    value = values[name]
    if opt.check is check_config:
      switches = value if isinstance(value, dict) else {n: getattr(value, n) for n, _, _ in QATConfig._schema}
      out += [switches[n] for n, _, _ in QATConfig._schema]
    else:
      out += opt.encode(value) if opt.encode else (value,)
  return tuple(out)


def from_scalars(cls, values):
  """The inverse of :func:`to_scalars`: ``cls`` from its scalars."""
  values, kwargs = list(values), {}
  for name, opt, _ in cls._schema:
    if opt.check is check_config:
      n = len(QATConfig._schema)
      kwargs[name], values = from_scalars(QATConfig, values[:n]), values[n:]
    elif opt.decode:
      n = len(opt.scalars)
      kwargs[name], values = opt.decode(*values[:n]), values[n:]
    else:
      kwargs[name], values = values[0], values[1:]
  if values:
    raise ValueError(f"{len(values)} scalars left over after {cls.__name__}'s fields")
  return cls(**kwargs)


# The optional mask operands, in the order every binding passes them (absent ones are left out):
# query_seq_lengths [B], key_value_seq_lengths [B], q_segment_ids [B, Tq], kv_segment_ids [B, Tk]; all int32.
# Key j is visible to query i of batch b only if i < q_len[b], j < kv_len[b] and q_seg[b, i] == kv_seg[b, j].
MASK_OPERANDS = ("q_len", "kv_len", "q_seg", "kv_seg")


def check_num_splits(name: str, value) -> int:
  """An int in [1, MAX_SPLITS] (the public None, a function of the shapes, is resolved before the check)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be None or an int in [1, {MAX_SPLITS}], got {value!r}")
  if not 1 <= value <= MAX_SPLITS:
    raise ValueError(f"{name} must be in [1, {MAX_SPLITS}], got {value}")
  return int(value)


@_with_schema
@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  """Everything static about one decode-attention call over a packed NVFP4 KV cache (docs/NUMERICS.md, section 10).

  config: the paper's switches; only quantize_qkv (for Q) and quantize_p act: the cache is NVFP4 by construction
  and decode has no backward.
  """

  scale: float = option(None, "the softmax scale (public default None: 1/sqrt(D); here always resolved)",
                        check=check_scale, resolved=True)
  is_causal: bool = option(True, "the Tq new tokens see each other causally (query i of a sequence of length L sees "
                           "keys j <= L - Tq + i); else every query sees all L keys", check=check_flag)
  block_n: int = option(DEFAULT_BLOCK_N, "the KV tile (part of the function, as in the forward)",
                        check=check_block_n)
  num_splits: int = option(None, "runs of tiles walked apart and merged by their maxima (1: the training forward's "
                           "walk; public default None: default_num_splits of the shapes)", check=check_num_splits,
                           resolved=True, field_default=1)
  config: QATConfig = option(QATConfig(), "the paper's switches (public: the four switch keywords)",
                             check=check_config)
  p_scale: str = option("block", "as in AttentionOptions", choices=P_SCALES, see="docs/NUMERICS.md")


def default_num_splits(batch: int, kv_heads: int, capacity: int, block_n: int) -> int:
  """The decode walk's splits when ``num_splits=None``: enough (batch, KV head, split) walks for a large GPU (about
  1024), each run at least 8 tiles long, at most MAX_SPLITS runs. A function of shapes alone, so every implementation
  and device computes the same function (the runs' own maxima decide fq(P))."""
  programs = max(1, batch * kv_heads)
  tiles = -(-max(capacity, 1) // block_n)
  return int(max(1, min(-(-1024 // programs), tiles // 8, MAX_SPLITS)))
