"""Launch plans: what the Triton kernels of an op launch, decided once for every framework.

A plan is plain data (framework-free; Triton is imported only for the kernels and
``triton.cdiv``): the buffers an op touches (shape, dtype, element strides) and its
launches in order, each a kernel, a grid, positional arguments (buffer references and
scalars), the buffers it writes, its constexprs, ``num_warps`` and ``num_stages``. The
JAX binding (``jqat.ffi.jax_launch``: jax-triton custom calls inside XLA) and the torch
binding (``jqat.ffi.torch_launch``: Triton's launcher on torch's current stream) are thin
executors of the same plan; neither decides a grid, a stride or a launch parameter.

Layout contract of the attention kernels: every tensor is a BTNH (``[B, T, heads, D]``)
view with a contiguous last axis, described by its element strides; JAX passes dense
row-major buffers, torch passes BHSD tensors as transposed views. Gradients are written
with the strides of the tensor they belong to (dq like q, dk like k, dv like v), fq(X)
scratch like X; ``lse`` and ``delta`` are dense ``[B, N, Tq]`` fp32. The fake-quantize
kernel walks a tensor as rows of D in storage order, so its input must be dense
(:func:`rows_dense`).

Launch configurations: the defaults per head dim live beside the kernels
(:class:`~jqat.kernels_triton.attention_fwd.ForwardConfig`,
:class:`~jqat.kernels_triton.attention_bwd.BackwardConfig`); :func:`set_config_override`
and the environment variables ``JQAT_ATTN_FWD_CONFIG`` / ``JQAT_ATTN_BWD_CONFIG``
(``"field=int,..."``, e.g. ``"block_m=128,num_warps=8"``) replace fields for both
bindings.
"""

from __future__ import annotations

import dataclasses
import math
import os

import triton

from jqat.ffi.options import MASK_OPERANDS, P_ROW_RANGE, AttentionOptions, DecodeOptions
from jqat.kernels_triton import attention_bwd as kbwd
from jqat.kernels_triton import attention_bwd_ws as kbws
from jqat.kernels_triton import attention_fwd as kfwd
from jqat.kernels_triton import attention_fwd_ws as kws
from jqat.kernels_triton import decode as kdec
from jqat.kernels_triton import decode_gluon as kdg
from jqat.kernels_triton import nvfp4 as knv
from jqat.kernels_triton import rope_qdq as krope
from jqat.kernels_triton.attention_common import dot_flags, segments_sorted_kernel, seq_align

# ----------------------------------------------------------------------------- plan data


@dataclasses.dataclass(frozen=True)
class Tensor:
  """A buffer of a plan: ``shape``, ``dtype`` name ("bfloat16", "float32", "int64", ...) and element strides."""

  shape: tuple[int, ...]
  dtype: str
  strides: tuple[int, ...]

  @classmethod
  def dense(cls, shape, dtype: str) -> Tensor:
    """A row-major buffer (every JAX array, and torch's contiguous tensors)."""
    shape = tuple(int(s) for s in shape)
    return cls(shape, dtype, tuple(math.prod(shape[i + 1:]) for i in range(len(shape))))

  @property
  def size(self) -> int:
    return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Ref:
  """A kernel argument that is the buffer named ``name`` of the plan."""

  name: str


@dataclasses.dataclass(frozen=True)
class Launch:
  """One kernel launch: ``kernel[grid](*args, *outputs, **constexprs, num_warps=, num_stages=)``.

  args: :class:`Ref` or Python int/float scalars (FP32 in the kernels), in kernel order.
  outputs: names of the buffers the launch writes; they follow ``args``.
  aliases: ``(arg index, output index)`` pairs of an output written over an input (in place).
  maxnreg: a cap on registers per thread (Triton's ``maxnreg`` option, ptxas' ``.maxnreg``); 0 for none.
  """

  name: str
  kernel: object
  grid: tuple[int, ...]
  args: tuple
  outputs: tuple[str, ...]
  constexprs: dict
  num_warps: int
  num_stages: int
  aliases: tuple[tuple[int, int], ...] = ()
  maxnreg: int = 0

  def options(self) -> dict:
    """Triton's options of this launch, for a compile or a ``kernel[grid](...)`` call: warps, stages and, where
    set, the register cap."""
    return {"num_warps": self.num_warps, "num_stages": self.num_stages,
            **({"maxnreg": self.maxnreg} if self.maxnreg else {})}


@dataclasses.dataclass(frozen=True)
class Plan:
  """Every buffer by name, which are the op's inputs, scratch and outputs, and the launches in order.

  fills: outputs set to a constant instead of computed (an op with nothing to launch, e.g. no keys).
  stored_in: intermediate buffers that live in another buffer's storage, not in ``scratch``: an output's
    (``{"k_hat": "dk"}``: the launch that writes the output reads the intermediate in place), or an input's
    that is dead by then (``{"q_hat": "o_for_delta"}``, JAX only). The launches' ``aliases`` say so, which
    is how XLA reuses the buffer; the torch binding hands the intermediate that buffer's tensor.
  """

  buffers: dict
  inputs: tuple[str, ...]
  scratch: tuple[str, ...]
  outputs: tuple[str, ...]
  launches: tuple[Launch, ...]
  fills: dict = dataclasses.field(default_factory=dict)
  stored_in: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Target:
  """Where a plan runs: a GPU's compute capability ``(major, minor)``, or the Triton interpreter."""

  compute_capability: tuple[int, int] | None = None
  interpret: bool = False

  def quant_flags(self) -> dict:
    return knv.quant_flags(self.compute_capability, self.interpret)

  def dot_flags(self, dtype: str) -> dict:
    return dot_flags(dtype, self.interpret)


def rows_dense(t: Tensor) -> bool:
  """True when ``t`` is ``size / D`` rows of ``D`` consecutive elements (dense, last axis contiguous)."""
  if not t.shape or t.strides[-1] != 1:
    return False
  expect = 1
  for stride, size in sorted((st, s) for st, s in zip(t.strides, t.shape) if s != 1):
    if stride != expect:
      return False
    expect *= size
  return True


# ----------------------------------------------------------------------------- launch configurations

_CONFIG_TYPES = {"fwd": kfwd.ForwardConfig, "bwd": kbwd.BackwardConfig, "decode": kdec.DecodeConfig}
_ENV = {"fwd": "JQAT_ATTN_FWD_CONFIG", "bwd": "JQAT_ATTN_BWD_CONFIG", "decode": "JQAT_DECODE_CONFIG"}
_OVERRIDES: dict = {"fwd": {}, "bwd": {}, "decode": {}}


def parse_config(text: str, kind: str) -> dict:
  """``"block_m=64,num_warps=4"`` -> ``{"block_m": 64, "num_warps": 4}``; fields of the ``kind`` config."""
  fields = [f.name for f in dataclasses.fields(_CONFIG_TYPES[kind])]
  out = {}
  for item in filter(None, (t.strip() for t in (text or "").split(","))):
    key, _, val = item.partition("=")
    key = key.strip()
    if key not in fields:
      raise ValueError(f"unknown {kind} launch-config field {key!r}; expected one of {fields}")
    try:
      out[key] = int(val)
    except ValueError:
      raise ValueError(f"launch-config field {key} must be an integer, got {val.strip()!r}") from None
  return out


def set_config_override(kind: str, config=None) -> None:
  """Overrides fields of the ``"fwd"`` or ``"bwd"`` launch configuration for every head dim, in both bindings.

  config: a ``ForwardConfig`` / ``BackwardConfig``, a dict of fields, a ``"field=int,..."`` string, or
  None to clear. Merged over the environment variable and the defaults; block sizes must keep the kernels'
  constraints (powers of two; ``kv_block_n % 16 == 0``). Functions traced afterwards use it.
  """
  if kind not in _CONFIG_TYPES:
    raise ValueError(f"kind must be one of {tuple(_CONFIG_TYPES)}, got {kind!r}")
  if isinstance(config, _CONFIG_TYPES[kind]):
    config = dataclasses.asdict(config)
  if config is None or isinstance(config, str):
    config = parse_config(config, kind)
  text = ",".join(f"{k}={v}" for k, v in dict(config).items())
  _OVERRIDES[kind] = parse_config(text, kind)


def _launch_config(kind: str, default):
  fields = {**parse_config(os.environ.get(_ENV[kind], ""), kind), **_OVERRIDES[kind]}
  return dataclasses.replace(default, **fields)


def forward_config(head_dim: int, residuals: bool = True) -> kfwd.ForwardConfig:
  """The forward's launch configuration for ``head_dim`` (``residuals=False``: O alone): defaults, then environment,
  then override."""
  return _launch_config("fwd", kfwd.forward_config(head_dim, residuals))


def decode_config(rows: int) -> kdec.DecodeConfig:
  """The decode split kernel's launch configuration for ``rows`` = G * Tq query rows per KV head: defaults, then
  environment (``JQAT_DECODE_CONFIG``), then override."""
  return _launch_config("decode", kdec.decode_config(rows))


def backward_config(head_dim: int, windowed: bool = False) -> kbwd.BackwardConfig:
  """The backward's launch configuration for ``head_dim`` (``windowed``: with a local window): defaults, then
  environment, then override."""
  return _launch_config("bwd", kbwd.backward_config(head_dim, windowed))


# ----------------------------------------------------------------------------- attention


def _s3(t: Tensor) -> tuple[int, int, int]:
  return t.strides[:3]


def _fake_quantize(srcs, dsts, xs, target: Target) -> Launch:
  """fq(x) along D into ``dst`` (strides of ``x``) for each ``(src, dst, x)``, in one launch (one to three tensors
  of the same D): each ``x`` is walked as rows of D in storage order."""
  for src, x in zip(srcs, xs):
    if not rows_dense(x):
      raise ValueError(f"{src}: the fake-quantize kernel needs a dense tensor with a contiguous last axis, "
                       f"got shape {x.shape} strides {x.strides}")
  d = xs[0].shape[-1]
  rows = tuple(x.size // d for x in xs)
  name = f"jqat_nvfp4_fake_quantize_{''.join(srcs)}"
  flags = target.quant_flags()
  if len(xs) == 1:
    grid, launch = knv.fake_quantize_launch(rows[0], d)
    return Launch(name, knv.fake_quantize_rows_kernel, grid, (Ref(srcs[0]), rows[0], d, d, d), tuple(dsts),
                  {key: launch[key] for key in ("BLOCK_R", "BLOCK_C", "EVEN")} | flags, launch["num_warps"],
                  launch["num_stages"])
  # One launch for two or three tensors, the same tiles and bits. Through JAX it is level with a launch per tensor;
  # the torch binding launches from Python, where three launches of the pass over 8 x 1024 x 16 rows each took
  # 0.107 ms back to back and one launch over all three 0.057 ms (host time, measured on the H200).
  kernel = {2: knv.fake_quantize_rows2_kernel, 3: knv.fake_quantize_rows3_kernel}[len(xs)]
  grid, launch = knv.fake_quantize_many_launch(rows, d)
  constexprs = {key: val for key, val in launch.items() if key not in ("num_warps", "num_stages")} | flags
  return Launch(name, kernel, grid, tuple(Ref(src) for src in srcs) + rows + (d,), tuple(dsts), constexprs,
                launch["num_warps"], launch["num_stages"])


def _quantized_inputs(names, tensors, enabled: bool, target: Target, buffers: dict):
  """Names the kernels read for ``names`` (fq scratch when ``enabled``), the scratch names and their launch."""
  if not enabled or not names:
    return list(names), (), ()
  hats = [f"{n}_hat" for n in names]
  for hat, t in zip(hats, tensors):
    buffers[hat] = t
  return hats, tuple(hats), (_fake_quantize(tuple(names), hats, tuple(tensors), target),)


# The live-row lengths of each tensor's amax under qkv_scale="tensor": queries for Q, keys for K and V.
_TENSOR_LENGTHS = {"q": "q_len", "k": "kv_len", "v": "kv_len"}


def _two_level_inputs(names, target: Target, buffers: dict):
  """qkv_scale="tensor": ``tensor_scale_kernel`` for Q, K and V (scratch ``q_enc``, ``k_enc``, ``v_enc``:
  ``[B, heads]`` fp32 encode scales, amax over the live rows only), then ``fake_quantize_scaled_kernel`` for
  the tensors ``names`` (scratch ``{name}_hat`` = fq(enc * X), X's strides). Returns, as
  :func:`_quantized_inputs`, the names the kernels read for ``names``, the scratch names and the launches."""
  launches = []
  for name in ("q", "k", "v"):
    x = buffers[name]
    b, t, heads, d = x.shape
    length = _TENSOR_LENGTHS[name]
    buffers[f"{name}_enc"] = Tensor.dense((b, heads), "float32")
    cfg = knv.tensor_scale_launch(d)
    launches.append(Launch(
        f"jqat_nvfp4_tensor_scale_{name}", knv.tensor_scale_kernel, (b * heads,),
        (Ref(name), Ref(length if length in buffers else name), t, heads, *_s3(x)), (f"{name}_enc",),
        dict(HEAD_DIM=d, D_PAD=cfg["D_PAD"], BLOCK_T=cfg["BLOCK_T"], HAS_LEN=length in buffers), cfg["num_warps"],
        cfg["num_stages"]))
  hats = [f"{n}_hat" for n in names]
  for name, hat in zip(names, hats):
    x = buffers[name]
    b, t, heads, d = x.shape
    buffers[hat] = x
    cfg = knv.tensor_scale_launch(d)
    launches.append(Launch(
        f"jqat_nvfp4_fake_quantize_scaled_{name}", knv.fake_quantize_scaled_kernel,
        (triton.cdiv(t, cfg["BLOCK_T"]), b * heads), (Ref(name), Ref(f"{name}_enc"), t, heads, *_s3(x)), (hat,),
        dict(HEAD_DIM=d, D_PAD=cfg["D_PAD"], BLOCK_T=cfg["BLOCK_T"], **target.quant_flags()), cfg["num_warps"],
        cfg["num_stages"]))
  return hats, ("q_enc", "k_enc", "v_enc", *hats), tuple(launches)


NO_MASKS = (None,) * len(MASK_OPERANDS)


def _masks(masks, b: int, tq: int, tk: int, buffers: dict):
  """The present mask operands' names (plan inputs), their kernel arguments, their constexprs and the launch
  that checks segment ids for sortedness (scratch ``seg_sorted`` [B] int32, with segments only).

  masks: ``jqat.ffi.options.MASK_OPERANDS`` order, each a dense int32 :class:`Tensor` or None. An absent operand's
  kernel argument is any buffer (``q``): the kernels read it only under its flag.
  """
  want = {"q_len": (b,), "kv_len": (b,), "q_seg": (b, tq), "kv_seg": (b, tk)}
  names = []
  for name, t in zip(MASK_OPERANDS, masks):
    if t is None:
      continue
    if t.shape != want[name] or t.dtype != "int32" or t.strides != Tensor.dense(t.shape, "int32").strides:
      raise ValueError(f"mask operand {name} must be a dense int32 tensor of shape {want[name]}, got {t}")
    buffers[name] = t
    names.append(name)
  if ("q_seg" in names) != ("kv_seg" in names):
    raise ValueError("mask operands q_seg and kv_seg must be given together")
  launches = ()
  if "q_seg" in names:
    buffers["seg_sorted"] = Tensor.dense((b,), "int32")
    launches = (Launch("jqat_attention_segments_sorted", segments_sorted_kernel, (b,),
                       (Ref("q_seg"), Ref("kv_seg"), tq, tk), ("seg_sorted",), {"BLOCK": 8192}, 8, 1),)
  args = tuple(Ref(name if name in buffers else "q") for name in MASK_OPERANDS + ("seg_sorted",))
  flags = dict(HAS_Q_LEN="q_len" in names, HAS_KV_LEN="kv_len" in names, HAS_SEG="q_seg" in names)
  return tuple(names), args, flags, launches


def _static_masks(opts: AttentionOptions) -> dict:
  left, right = opts.local_window_size if opts.local_window_size is not None else (-1, -1)
  return dict(IS_CAUSAL=opts.is_causal, WINDOW_LEFT=left, WINDOW_RIGHT=right,
              BOTTOM_RIGHT=opts.causal_alignment == "bottom_right")


def _head_dims(d: int) -> dict:
  """The true head dim and the kernels' tile width along D (the next power of two; padded channels read 0)."""
  return dict(HEAD_DIM=d, D_PAD=triton.next_power_of_2(d))


def _tensor_mode(opts: AttentionOptions) -> bool:
  """qkv_scale="tensor" with Q, K, V quantized (without quantization the scale mode has no effect)."""
  return opts.qkv_scale == "tensor" and opts.config.quantize_qkv


def kept_quantized(opts: AttentionOptions) -> tuple[str, ...]:
  """Which of q, k, v the forward returns fake-quantized under ``keep_quantized``: K and V whenever the plans
  quantize them by a pass (``quantize_qkv``, qkv_scale="block").

  Not Q: the backward forms fq(Q) in the delta launch, over O''s storage, which is dead then. Kept from the
  forward instead, fq(Q) and O' are both live in the backward: jax.grad at (1, 8, 65536, 128) causal peaked at
  1212 MB against 1078 (the memory bound, 1.2x of inputs + outputs + residuals, exceeded: 1.287x; measured on the
  H200), for a 42 us saving at 16k."""
  return ("k", "v") if opts.config.quantize_qkv and not _tensor_mode(opts) else ()


def attention_forward(q: Tensor, k: Tensor, v: Tensor, opts: AttentionOptions, target: Target, *,
                      out_strides=None, config: kfwd.ForwardConfig | None = None, masks=NO_MASKS,
                      keep_quantized: bool = False, residuals: bool = True) -> Plan:
  """Plan of the QAT forward: outputs ``o``, ``o_hp`` (``[B, Tq, N, D]``, strides ``out_strides``, default dense)
  and ``lse`` (``[B, N, Tq]`` fp32, dense); with ``opts.p_scale == "row"`` also ``row_max`` (``[B, N, Tq]``
  fp32, dense: the final row max, natural units). q: ``[B, Tq, N, D]``; k, v: ``[B, Tk, K, D]``, N % K == 0.
  masks: optional mask operands in ``MASK_OPERANDS`` order; the present ones are inputs after q, k, v.
  qkv_scale="tensor" (docs/NUMERICS.md) adds launches before the forward: ``tensor_scale_kernel`` for Q, K, V
  (scratch ``q_enc``, ``k_enc``, ``v_enc``) and ``fake_quantize_scaled_kernel`` for K, V (and Q above D = 128,
  scratch ``q_hat``), in place of the fake-quantize launches; the forward kernel then reads the encode scales
  (``QKV_TENSOR``).
  With a causal mask, a window or segment ids, or D > 32 (and Q dense in storage), fq(Q) comes from the
  fake-quantize pass too (scratch ``q_hat``) and the forward kernel reads it (``QUANTIZE_Q`` off); otherwise the
  kernel rounds its own Q tile.
  keep_quantized: fq(K), fq(V) (:func:`kept_quantized`) are outputs after the others (``k_hat``, ``v_hat``, with
  K's and V's shapes and strides), not scratch: a backward given them (:func:`attention_backward`'s
  ``quantized``) needs no quantize pass for them.
  residuals=False: ``o`` is the only output (no O', lse or row max, nothing kept), from the forward kernel with
  ``RESIDUALS`` off: the same O without the O' product (for a forward that nothing
  differentiates)."""
  if keep_quantized and not residuals:
    raise ValueError("keep_quantized needs residuals: fq(K), fq(V) are kept for a backward")
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  strides = tuple(out_strides) if out_strides is not None else Tensor.dense(q.shape, q.dtype).strides
  o = Tensor(q.shape, q.dtype, strides)
  buffers = {"q": q, "k": k, "v": v, "o": o}
  if residuals:
    buffers.update(o_hp=o, lse=Tensor.dense((b, n, tq), "float32"))
  mask_names, mask_args, mask_flags, mask_launches = _masks(masks, b, tq, tk, buffers)
  inputs = ("q", "k", "v") + mask_names
  outputs = ("o", "o_hp", "lse") if residuals else ("o",)
  row = opts.p_scale == "row"
  if row and residuals:
    buffers["row_max"] = Tensor.dense((b, n, tq), "float32")
    outputs += ("row_max",)
  kept = ()
  for name in kept_quantized(opts) if keep_quantized else ():
    buffers[f"{name}_hat"] = buffers[name]
    kept += (f"{name}_hat",)
  if q.size == 0 or k.size == 0:  # no rows, or no keys: O = O' = 0, lse = row_max = -inf; kept fq(X) 0
    # (an empty op's backward reads none of its inputs)
    fills = {"o": 0.0, "o_hp": 0.0, "lse": float("-inf"), "row_max": float("-inf"), **dict.fromkeys(kept, 0.0)}
    return Plan(buffers, inputs, (), outputs + kept, (), {name: fills[name] for name in outputs + kept})
  cfg = opts.config
  tensor = _tensor_mode(opts)
  # fq(Q) by the pass, with K and V, where the tile walks are short or masked (causal, window): there the kernel
  # without its own Q rounding ran faster; without those masks the kernel that rounds its Q tile itself (and keeps
  # it in registers for the QK^T product) did, as long as it did not spill. Above D = 128 that kernel is short of
  # registers and ptxas serializes its wgmma: the pass is 12-16% faster there, masks or not. With packed
  # documents (segment ids) the kernel that rounds its own Q spilled in every loop; from the pass it does not,
  # and packed non-causal 16k with documents of 1024 ran 31% faster. With the E2M1 rounding as a quotient, the
  # no-mask kernel at 64 < D <= 128 that rounds its own Q spills in its loop (965 instructions, 21 LDL) where the
  # one reading fq(Q) does not (930): the pass there too (that forward kernel 9-11% faster at 4k and 16k, the pass
  # 0.012-0.038 ms longer). At 32 < D <= 64, on 64 rows / 4 warps, fq(Q) from the pass leaves O alone at 140
  # registers (own Q: 163), which a cap of 128 fits without spilling in its loops: four programs per SM
  # (OUT_CONFIGS: 1.5-2.3% faster than own Q uncapped, while the pass without the cap was 2-4% slower). D <= 32
  # keeps its own Q (there the pass was level or slower). Measured on the H200: docs/PERFORMANCE.md, section 3.
  q_pass = (cfg.quantize_qkv and not tensor and rows_dense(q)
            and (opts.is_causal or opts.local_window_size is not None or q.shape[-1] > 32 or mask_flags["HAS_SEG"]))
  qq = "q"
  # qkv_scale="tensor": Q is quantized inside the forward kernel, from its encode scale, up to D = 128; above, that
  # kernel is short of registers and ptxas serialized its wgmma at D = 144-256 (an offline build of every head dim,
  # as for the other modes): there fq(enc * Q) comes from the pass with K and V (the forward kernel measured 18%
  # faster at D = 192 and 256, the same bits).
  tensor_q_pass = tensor and d > 128
  if tensor_q_pass:
    (qq, kk, vv), scratch, launches = _two_level_inputs(("q", "k", "v"), target, buffers)
  elif tensor:
    (kk, vv), scratch, launches = _two_level_inputs(("k", "v"), target, buffers)
  elif q_pass:
    (qq, kk, vv), scratch, launches = _quantized_inputs(("q", "k", "v"), (q, k, v), True, target, buffers)
  else:
    (kk, vv), scratch, launches = _quantized_inputs(("k", "v"), (k, v), cfg.quantize_qkv, target, buffers)
  scratch += tuple(launch.outputs[0] for launch in mask_launches)
  launches += mask_launches
  c = config or forward_config(d, residuals)
  # One kernel for every variant: the flags pick it, the encode scales are placeholders (q) without
  # qkv_scale="tensor", and an output this plan does not have is None (row max in "block"; without residuals all
  # but o).
  absent = () if residuals else ("o_hp_ptr", "lse_ptr")
  absent += () if row and residuals else ("m_ptr",)
  flags = dict.fromkeys(absent) | dict(P_ROW_RANGE=P_ROW_RANGE if row else 0.0, QKV_TENSOR=tensor,
                                       RESIDUALS=residuals)
  flags.update(QUANTIZE_Q=(not tensor_q_pass) if tensor else (cfg.quantize_qkv and not q_pass))
  enc_args = (Ref("q_enc"), Ref("k_enc"), Ref("v_enc")) if tensor else (Ref("q"),) * 3
  fwd = Launch(
      "jqat_attention_fwd", kfwd.attention_fwd_kernel, (triton.cdiv(tq, c.block_m), b * n),
      (Ref(qq), Ref(kk), Ref(vv), float(opts.scale), tq, tk, n, n // kh, *mask_args, *enc_args, Ref(qq), *_s3(q),
       *_s3(k), *_s3(v), *_s3(o)),  # leak_ptr (read in REDO mode only): a placeholder
      outputs,
      dict(**_head_dims(d), BLOCK_M=c.block_m, BLOCK_N=opts.block_n, **_static_masks(opts), **mask_flags,
           QUANTIZE_P=cfg.quantize_p, **target.dot_flags(q.dtype), **target.quant_flags(), **flags,
           SEQ_ALIGN=seq_align(tq, tk), REDO=False),
      c.num_warps, c.num_stages, maxnreg=c.maxnreg)
  choice = forward_kernel()
  if (choice != "triton" and _ws_takes(q, k, v, o, opts, target, bool(mask_names) or tensor or not q_pass)
      and (choice == "ws" or _ws_pays(tq, opts))):
    return _forward_ws(q, k, v, o, opts, target, buffers, inputs, outputs, scratch, launches, qq, kk, vv, fwd, kept)
  scratch = tuple(name for name in scratch if name not in kept)
  return Plan(buffers, inputs, scratch, outputs + kept, launches + (fwd,))


FWD_KERNEL_ENV = "JQAT_ATTN_FWD_KERNEL"
BWD_KERNEL_ENV = "JQAT_ATTN_BWD_KERNEL"
KERNEL_CHOICES = ("triton", "ws")  # of JQAT_ATTN_FWD_KERNEL and JQAT_ATTN_BWD_KERNEL
_WS_ROWS = 2 * int(kws.WG_ROWS.value)  # query rows of a warp-specialized program: its two consumer warpgroups'


# The shortest causal walk (query rows) on which the default forward takes the warp-specialized kernel: through
# jax.jit on an H100 it was slower than the Triton kernel at (1, 16, 4096, 128) and (8, 16, 1024, 128) causal, the
# forward alone and fwd+bwd, and faster at 8192 and 16384 rows (docs/BENCHMARKS.md).
WS_CAUSAL_MIN_ROWS = 8192


def _kernel_choice(env: str, default: str = "triton") -> str:
  """``env``'s value (one of KERNEL_CHOICES), or ``default`` where it is unset or empty."""
  choice = os.environ.get(env)
  if not choice:
    return default
  if choice not in KERNEL_CHOICES:
    raise ValueError(f"{env} must be one of {KERNEL_CHOICES} (or unset), got {choice!r}")
  return choice


def forward_kernel() -> str:
  """The forward's kernel (O alone and the training forward): unset ("auto"), the warp-specialized Gluon kernel
  (``kernels_triton.attention_fwd_ws``) wherever it takes the launch (:func:`_ws_takes`) and is the faster
  (:func:`_ws_pays`), the Triton kernel (``attention_fwd_kernel``) elsewhere; "ws" (``JQAT_ATTN_FWD_KERNEL=ws``) the
  warp-specialized kernel wherever it takes the launch; "triton" the Triton kernel always. Both compute the same bits
  on every check case (docs/BENCHMARKS.md)."""
  return _kernel_choice(FWD_KERNEL_ENV, "auto")


def _ws_pays(tq: int, opts: AttentionOptions) -> bool:
  """Whether the default forward takes the warp-specialized kernel where it could: not on causal walks of fewer than
  WS_CAUSAL_MIN_ROWS query rows."""
  return not opts.is_causal or tq >= WS_CAUSAL_MIN_ROWS


def backward_kernel() -> str:
  """The dK/dV kernel: "ws" (the default) launches the warp-specialized Gluon kernel
  (``kernels_triton.attention_bwd_ws``) wherever it takes the launch (:func:`_ws_dkdv_takes`) and the Triton kernel
  (``attention_bwd_dkdv_kernel``) elsewhere; "triton" (``JQAT_ATTN_BWD_KERNEL=triton``) the Triton kernel always.
  Both compute the same bits: the warp-specialized kernel runs the Triton kernel's expressions in its order
  (docs/BENCHMARKS.md)."""
  return _kernel_choice(BWD_KERNEL_ENV, "ws")


def _ws_takes(q, k, v, o, opts, target, other) -> bool:
  """Whether the warp-specialized forward takes this forward launch (O alone, or O, O' and lse for a backward, with
  the row max in row mode): sm_90, D = 128 or 96 (on tiles of 128 channels, as the Triton kernel's), no masks but a
  causal one aligned top-left (or Tq = Tk), p_scale "block" or "row", fq(P) on, fq(Q) from the pass, rows of whole
  16-element strides (any lengths: the last row block and key tile may be partial). ``other``: masks, tensor scales,
  or Q not from the pass. Not D = 64, which the kernel computes too: there it runs 8 consumer
  warps per SM against the Triton kernel's 16 (four programs of 128 registers), and two of its programs per SM would
  leave 104 registers a consumer thread, which spill and serialize its wgmma. A causal walk is followed by the Triton
  kernel's REDO launch (:func:`_forward_ws`)."""
  tq, d = q.shape[1], q.shape[3]
  tk = k.shape[1]
  tensors = (q, k, v, o)
  dense16 = (_pow2_divisor([s for t in tensors for s in _s3(t)]) == 16
             and all(t.strides[3] == 1 for t in tensors))
  top_left = not opts.is_causal or opts.causal_alignment == "top_left" or tq == tk
  return (not other and d in (96, 128) and tq > 0 and tk > 0 and dense16 and top_left
          and opts.block_n == kws.BLOCK_N and opts.local_window_size is None and opts.p_scale in ("block", "row")
          and opts.config.quantize_p and not target.interpret and tuple(target.compute_capability or ()) == (9, 0))


def _forward_ws(q, k, v, o, opts, target, buffers, inputs, outputs, scratch, launches, qq, kk, vv, fwd: Launch,
                kept: tuple) -> Plan:
  """The forward plan's last launch by ``attention_fwd_ws_kernel`` on fq(Q), fq(K), fq(V) from the pass (the launches
  so far) in place of the Triton launch ``fwd``: O alone (lse to scratch) or, with the plan's residuals, O, O' and
  lse (and in row mode the row max). Only where :func:`_ws_takes`.

  A causal walk may carry a NaN of V to a row that does not see its key (0 * NaN at a hidden pair of the diagonal
  tile): the kernel then stores nothing of that consumer's 64 rows and sets their flag (``fwd_leaks``, every flag
  written), and ``fwd`` follows in REDO mode, walking exactly (docs/NUMERICS.md, section 5, "NaN") those row tiles
  and only those; without a NaN each of its programs reads one flag and returns."""
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  residuals = "o_hp" in outputs
  row = opts.p_scale == "row"
  params = kws.launch_params(d, compute_capability=tuple(target.compute_capability), is_causal=opts.is_causal,
                             residuals=residuals, p_row_range=P_ROW_RANGE if row else 0.0)
  num_warps, maxnreg = params.pop("num_warps"), params.pop("maxnreg")
  rows = int(kws.WG_ROWS.value)
  lse = "lse" if residuals else "lse_ws"
  if not residuals:
    buffers["lse_ws"] = Tensor.dense((b, n, tq), "float32")
  # The NaN flags, per 64-row tile (without a causal mask a placeholder the kernel never touches).
  buffers["fwd_leaks"] = Tensor.dense((b * n, triton.cdiv(tq, rows)) if opts.is_causal else (1,), "int32")
  grid = (b * n, triton.cdiv(tq, _WS_ROWS)) if opts.is_causal else (triton.cdiv(tq, _WS_ROWS), b * n)
  ws = Launch("jqat_attention_fwd_ws", kws.attention_fwd_ws_kernel, grid,
              (Ref(qq), Ref(kk), Ref(vv), float(opts.scale), tq, tk, n, n // kh, *_s3(q), *_s3(k), *_s3(v),
               *_s3(o)), ("o", lse, "fwd_leaks") + ("o_hp",) * residuals + ("row_max",) * (residuals and row), params,
              num_warps, 1, maxnreg=maxnreg)
  scratch = tuple(name for name in scratch if name not in kept) + ("fwd_leaks",) + ("lse_ws",) * (not residuals)
  if not opts.is_causal:
    return Plan(buffers, inputs, scratch, outputs + kept, launches + (ws,))
  # The flags are per row tile of one consumer warpgroup (64 rows): the REDO launch reads them as its own row tiles',
  # whatever the Triton kernel's configuration (its exact walk gives each row's outputs whatever the row tile).
  fwd = dataclasses.replace(fwd, grid=(triton.cdiv(tq, rows), *fwd.grid[1:]),
                            constexprs=dict(fwd.constexprs, BLOCK_M=rows))
  return Plan(buffers, inputs, scratch, outputs + kept, launches + (ws, forward_redo_launch(fwd)))


def forward_redo_launch(fwd: Launch) -> Launch:
  """The Triton forward launch ``fwd`` (block scales, no masks but the causal one: O alone, or O, O' and lse, and in
  row mode the row max) in REDO mode: the flags ``fwd_leaks`` (one per row tile of its grid) in leak_ptr's slot, and
  its outputs written in place, only in the flagged tiles: each output's buffer is an input that it aliases, in the
  slots of the encode scales (read only with qkv_scale="tensor") and then of seg_sorted (read only with segment
  ids)."""
  c = fwd.constexprs
  assert (fwd.kernel is kfwd.attention_fwd_kernel and not c["QKV_TENSOR"] and not c["HAS_SEG"]
          and len(fwd.outputs) <= 4)
  args = list(fwd.args)
  slots = tuple(_arg_index(fwd.kernel, name) for name in ("q_enc_ptr", "k_enc_ptr", "v_enc_ptr", "seg_sorted_ptr"))
  args[_arg_index(fwd.kernel, "leak_ptr")] = Ref("fwd_leaks")
  for slot, name in zip(slots, fwd.outputs):
    args[slot] = Ref(name)
  return dataclasses.replace(fwd, name="jqat_attention_fwd_redo", args=tuple(args),
                             constexprs=dict(fwd.constexprs, REDO=True),
                             aliases=tuple((slot, i) for i, slot in enumerate(slots[:len(fwd.outputs)])))


def _ws_dkdv_takes(d_out, q, k, v, opts, target, other) -> bool:
  """Whether the warp-specialized dK/dV kernel takes this backward's dK/dV launch: sm_90, bf16, D of 64, 96 or 128, Tk a
  multiple of 16 (fq(P)'s blocks along keys), no masks but a causal one, qkv_scale="block", fq(P) on in the backward
  (relative to lse or the row max: the forward's KV tile plays no part), heads side by side in q, dO, k and v
  (``stride_h == D``, the descriptors' columns) and rows of whole 16-element strides. ``other``: masks other than the
  causal one, or tensor scales. A causal walk also needs fq(K) and fq(V) in dK's and dV's storage (quantize_qkv),
  where the Triton kernel's exact walk finds them for a key tile that a NaN reached (:func:`_dkdv_ws`)."""
  tq, d = q.shape[1], q.shape[3]
  tk = k.shape[1]
  tensors = (d_out, q, k, v)
  dense16 = (_pow2_divisor([s for t in tensors for s in _s3(t)]) == 16
             and all(t.strides[3] == 1 and t.strides[2] == d for t in tensors))
  return (not other and d in kbws.HEAD_DIMS and all(t.dtype == "bfloat16" for t in tensors)
          and tq > 0 and tk % 16 == 0 and tk > 0 and dense16
          and (not opts.is_causal or opts.config.quantize_qkv) and opts.local_window_size is None
          and opts.config.quantize_p_backward and not target.interpret
          and tuple(target.compute_capability or ()) == (9, 0))


def _kv_config(c: kbwd.BackwardConfig) -> tuple:
  return c.kv_block_n, c.kv_block_m, c.kv_num_warps, c.kv_num_stages


def _dkdv_ws(d_out, q, k, v, qq, kk, vv, opts, target, in_grads, row: bool, redo: Launch) -> tuple[Launch, ...]:
  """The backward plan's dK/dV launch by ``attention_bwd_dkdv_ws_kernel`` (only where :func:`_ws_dkdv_takes`): the
  same arguments' buffers as the Triton launch's (fq(Q), fq(K), fq(V), dO, lse, delta, and with ``row`` the row
  factors; else lse in their place), the same outputs and the same in-place writes over fq(K) and fq(V) where they
  live in dK's and dV's storage (``in_grads``), and the key tiles' NaN flags (``dkdv_leaks``). A causal walk is
  followed by ``redo``, the Triton launch in REDO mode over dK and dV (fq(K) and fq(V) still in the key tiles whose
  flag is set, which it walks exactly and only those)."""
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  params = kbws.launch_params(d, compute_capability=tuple(target.compute_capability),
                              p_row_range=P_ROW_RANGE if row else 0.0, tq=tq, tk=tk, is_causal=opts.is_causal)
  num_warps, maxnreg = params.pop("num_warps"), params.pop("maxnreg")
  off = tk - tq if opts.is_causal and opts.causal_alignment == "bottom_right" else 0
  args = (Ref(qq), Ref(kk), Ref(vv), Ref("do"), Ref("lse"), Ref("delta"), Ref("row_factors" if row else "lse"),
          float(opts.scale), tq, tk, n, n // kh, off,
          *_s3(q), *_s3(k), *_s3(v), *_s3(d_out))
  aliases = tuple((args.index(Ref(name)), ("dk", "dv").index(out)) for name, out in in_grads.items())
  ws = Launch("jqat_attention_bwd_dkdv_ws", kbws.attention_bwd_dkdv_ws_kernel,
              (triton.cdiv(tk, kbws.BLOCK_N.value), b * kh), args, ("dk", "dv", "dkdv_leaks"), params, num_warps, 1,
              aliases, maxnreg=maxnreg)
  if not opts.is_causal:
    return (ws,)
  # The NaN flags are per key tile of one consumer warpgroup (64 keys): the REDO launch reads them as its own key
  # tiles', so it walks tiles of 64 keys whatever the Triton kernel's default (128 at D = 64; its exact walk gives
  # each key's dK and dV whatever the key tile).
  redo = dataclasses.replace(redo, grid=(triton.cdiv(tk, kbws.WG_ROWS.value), *redo.grid[1:]),
                             constexprs=dict(redo.constexprs, BLOCK_N=kbws.WG_ROWS.value))
  return ws, redo_launch(redo, kk, vv)


def _arg_index(kernel, name: str) -> int:
  """The place of ``kernel``'s argument ``name`` in a launch's arguments: its place in the signature (the launches'
  arguments are the signature's leading ones, outputs and constexprs after them)."""
  return kernel.arg_names.index(name)


_LEAK_ARG = _arg_index(kbwd.attention_bwd_dkdv_kernel, "leak_ptr")  # read in REDO mode only


def redo_launch(dkdv: Launch, kk: str, vv: str) -> Launch:
  """The Triton dK/dV launch ``dkdv`` (reading fq(K), fq(V) as ``kk``, ``vv``) in REDO mode: it reads fq(K) and fq(V)
  from dK's and dV's storage instead (where they stay in a key tile whose flag is set), the flags from
  ``dkdv_leaks``, and writes dK and dV in place, only in those tiles."""
  args = tuple(Ref({kk: "dk", vv: "dv"}.get(a.name, a.name)) if isinstance(a, Ref) else a for a in dkdv.args)
  args = args[:_LEAK_ARG] + (Ref("dkdv_leaks"),) + args[_LEAK_ARG + 1:]
  return dataclasses.replace(dkdv, name="jqat_attention_bwd_dkdv_redo", args=args,
                             constexprs=dict(dkdv.constexprs, REDO=True),
                             aliases=((args.index(Ref("dk")), 0), (args.index(Ref("dv")), 1)))


def attention_backward(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out_for_delta: Tensor, lse: Tensor,
                       opts: AttentionOptions, target: Target, *, config: kbwd.BackwardConfig | None = None,
                       masks=NO_MASKS, row_max: Tensor | None = None, q_hat_over_out: bool = False,
                       quantized: tuple[str, ...] = ()) -> Plan:
  """Plan of the QAT backward: outputs ``dq``, ``dk``, ``dv`` with the strides of q, k, v.

  d_out, out_for_delta, q: ``[B, Tq, N, D]``; k, v: ``[B, Tk, K, D]``; lse: ``[B, N, Tq]`` fp32 dense.
  row_max: ``[B, N, Tq]`` fp32 dense, the forward's, given exactly when ``opts.p_scale == "row"``
  (an input after lse).
  masks: as in :func:`attention_forward` (inputs after lse and row_max).
  Scratch: ``delta`` (``[B, N, Tq]`` fp32) and, with ``quantize_qkv``, fq(Q); fq(K) and fq(V) are written into
  dk's and dv's storage (``Plan.stored_in``), which the dK/dV kernel then overwrites in place. With
  qkv_scale="tensor" these are fq(enc * X), after the encode scales ``q_enc``, ``k_enc``, ``v_enc``
  (``[B, heads]`` fp32, scratch), which the dQ and dK/dV kernels read (``QKV_TENSOR``).
  q_hat_over_out: write fq(Q) over ``o_for_delta``'s storage, which is dead once delta is formed
  (``attention_bwd_delta_fq_kernel`` forms both; ``Plan.stored_in`` says so and the launch aliases it), so
  that fq(Q) needs no scratch. Only for executors whose buffers are values, as XLA's are: XLA orders any
  other reader of O' first, or copies it. (The torch binding keeps O' intact: autograd may read a saved
  tensor again.) Applies with quantize_qkv, qkv_scale="block" and ``o_for_delta`` laid out as q.
  quantized: names among ``("k", "v")`` whose tensor is already fq(X), the forward's (its ``keep_quantized``
  outputs, :func:`kept_quantized`): the kernels read it as it is, with no quantize pass, and dK, dV overwrite it
  in place (the launch aliases it), as they do the pass's output otherwise. With quantize_qkv and
  qkv_scale="block" only."""
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  buffers = {"do": d_out, "q": q, "k": k, "v": v, "o_for_delta": out_for_delta, "lse": lse,
             "dq": q, "dk": k, "dv": v}
  row = opts.p_scale == "row"
  if row != (row_max is not None):
    raise ValueError(f"row_max must be given exactly when p_scale='row' (p_scale={opts.p_scale!r}, row_max={row_max})")
  stats = ("lse",)
  if row:
    if row_max != Tensor.dense((b, n, tq), "float32"):
      raise ValueError(f"row_max must be a dense float32 tensor of shape {(b, n, tq)}, got {row_max}")
    buffers["row_max"] = row_max
    stats += ("row_max",)
  mask_names, mask_args, mask_flags, mask_launches = _masks(masks, b, tq, tk, buffers)
  inputs = ("do", "q", "k", "v", "o_for_delta") + stats + mask_names
  outputs = ("dq", "dk", "dv")
  if q.size == 0 or k.size == 0:  # every gradient is an empty sum
    return Plan(buffers, inputs, (), outputs, (), {"dq": 0.0, "dk": 0.0, "dv": 0.0})
  cfg = opts.config
  tensor = _tensor_mode(opts)
  given = tuple(quantized)
  if given and (not set(given) <= {"k", "v"} or tensor or not cfg.quantize_qkv):
    raise ValueError(f"quantized names inputs among k, v given as fq(X), with quantize_qkv and qkv_scale='block' "
                     f"only; got {given} (quantize_qkv={cfg.quantize_qkv}, qkv_scale={opts.qkv_scale!r})")
  q_over_o = q_hat_over_out and cfg.quantize_qkv and not tensor and out_for_delta == q
  if tensor:
    (qq, kk, vv), scratch, launches = _two_level_inputs(("q", "k", "v"), target, buffers)
  else:
    # fq(Q) over O''s storage comes from the delta launch; what is given is read as it is; the rest by the pass.
    passed = [name for name in ("q", "k", "v") if name not in given and not (name == "q" and q_over_o)]
    hats, scratch, launches = _quantized_inputs(passed, [buffers[name] for name in passed], cfg.quantize_qkv, target,
                                                buffers)
    read = {"q": "q", "k": "k", "v": "v", **dict(zip(passed, hats))}
    if q_over_o:
      read["q"] = "q_hat"
      buffers["q_hat"] = q
    qq, kk, vv = read["q"], read["k"], read["v"]
  scratch += tuple(launch.outputs[0] for launch in mask_launches)
  launches += mask_launches
  buffers["delta"] = Tensor.dense((b, n, tq), "float32")
  grid = (triton.cdiv(tq, kbwd.DELTA_LAUNCH["BLOCK_M"]), b * n)
  delta_flags = dict(**_head_dims(d), BLOCK_M=kbwd.DELTA_LAUNCH["BLOCK_M"])
  delta_args = (Ref("o_for_delta"), Ref("do"), tq, n, *_s3(out_for_delta), *_s3(d_out))
  if q_over_o:
    delta = Launch("jqat_attention_bwd_delta_fq", kbwd.attention_bwd_delta_fq_kernel, grid,
                   delta_args[:2] + (Ref("q"),) + delta_args[2:] + _s3(q), ("delta", qq),
                   dict(**delta_flags, **target.quant_flags()), kbwd.DELTA_LAUNCH["num_warps"],
                   kbwd.DELTA_LAUNCH["num_stages"], aliases=((0, 1),))
  else:
    delta = Launch("jqat_attention_bwd_delta", kbwd.attention_bwd_delta_kernel, grid, delta_args, ("delta",),
                   delta_flags, kbwd.DELTA_LAUNCH["num_warps"], kbwd.DELTA_LAUNCH["num_stages"])
  c = config or backward_config(d, opts.local_window_size is not None)
  enc_args = (Ref("q_enc"), Ref("k_enc"), Ref("v_enc")) if tensor else (Ref(qq),) * 3  # read under QKV_TENSOR
  common = (Ref(qq), Ref(kk), Ref(vv), Ref("do"), Ref("lse"), Ref("delta"), float(opts.scale), tq, tk, n, n // kh,
            *mask_args, *enc_args, *_s3(q), *_s3(k), *_s3(v), *_s3(d_out))
  flags = dict(**_head_dims(d), **_static_masks(opts), **mask_flags, **target.dot_flags(q.dtype), QKV_TENSOR=tensor)
  dq = Launch("jqat_attention_bwd_dq", kbwd.attention_bwd_dq_kernel, (triton.cdiv(tq, c.dq_block_m), b * n), common,
              ("dq",), dict(BLOCK_M=c.dq_block_m, BLOCK_N=c.dq_block_n, **flags,
                            SEQ_ALIGN=seq_align(tq, tk)),
              c.dq_num_warps, c.dq_num_stages)
  # The dK/dV kernel's rf_ptr follows delta: with "row" the per-row factors R * l, 1 / (R * l) of the forward's
  # row max, formed by a launch of their own; "block" never reads it (lse stands in).
  row_factors = ()
  if row:
    buffers["row_factors"] = Tensor.dense((b, n, 2, tq), "float32")
    rows, rf = b * n * tq, kbwd.ROW_FACTORS_LAUNCH
    row_factors = (Launch("jqat_attention_bwd_row_factors", kbwd.attention_bwd_row_factors_kernel,
                          (triton.cdiv(rows, rf["BLOCK"]),), (Ref("lse"), Ref("row_max"), rows, tq), ("row_factors",),
                          dict(P_ROW_RANGE=P_ROW_RANGE, BLOCK=rf["BLOCK"]), rf["num_warps"], rf["num_stages"]),)
  kv_args = common[:6] + (Ref("row_factors" if row else "lse"),) + common[6:]
  kv_args = kv_args[:_LEAK_ARG] + (Ref(qq),) + kv_args[_LEAK_ARG:]  # leak_ptr: read in REDO mode only
  row_range = P_ROW_RANGE if row else 0.0
  # fq(K) and fq(V), the pass's or the forward's (given), live in dK's and dV's storage (issue 13's memory bound:
  # two fewer K/V-sized buffers at the backward's peak). Safe in place: the dQ kernel, which reads every key, runs
  # first, and each dK/dV program reads only the key rows it owns and writes them after its last read.
  in_grads = {kk: "dk", vv: "dv"} if cfg.quantize_qkv else {}
  aliases = tuple((kv_args.index(Ref(name)), ("dk", "dv").index(out)) for name, out in in_grads.items())
  stored_in = {**{hat: grad for hat, grad in in_grads.items() if hat not in given},
               **({qq: "o_for_delta"} if q_over_o else {})}
  # A dK/dV launch configuration other than the default (JQAT_ATTN_BWD_CONFIG, set_config_override) is the Triton
  # kernel's: it keeps that kernel.
  kv_default = _kv_config(c) == _kv_config(kbwd.backward_config(d, opts.local_window_size is not None))
  dkdv = (Launch("jqat_attention_bwd_dkdv", kbwd.attention_bwd_dkdv_kernel,
                 (triton.cdiv(tk, c.kv_block_n), b * kh), kv_args, ("dk", "dv"),
                 dict(BLOCK_M=c.kv_block_m, BLOCK_N=c.kv_block_n, QUANTIZE_P=cfg.quantize_p_backward, **flags,
                      **target.quant_flags(), P_ROW_RANGE=row_range, REDO=False),
                 c.kv_num_warps, c.kv_num_stages, aliases),)
  if (backward_kernel() == "ws" and kv_default
          and _ws_dkdv_takes(d_out, q, k, v, opts, target, bool(mask_names) or tensor)):
    # The NaN flags (without a causal mask a placeholder the kernel never touches).
    leaks = (b * kh, triton.cdiv(tk, kbws.WG_ROWS.value)) if opts.is_causal else (1,)
    buffers["dkdv_leaks"] = Tensor.dense(leaks, "int32")
    scratch += ("dkdv_leaks",)
    dkdv = _dkdv_ws(d_out, q, k, v, qq, kk, vv, opts, target, in_grads, row, dkdv[0])
  scratch = tuple(name for name in scratch if name not in stored_in) + ("delta",) + ("row_factors",) * row
  return Plan(buffers, inputs, scratch, outputs, launches + (delta, *row_factors, dq, *dkdv), stored_in=stored_in)


# ----------------------------------------------------------------------------- qat_matmul's quantize passes
# jqat.nvfp4.qat_matmul quantizes x [..., K] along its last axis and w [K, N] along its first, once each, then
# hands fq(x), fq(w) to a BF16 dot (XLA's, cuBLAS on the GPU). These plans are those two passes: one launch each,
# reading x's dtype and writing ``out_dtype`` (bf16 for the dot; fq values are exact in bf16, fp16 and fp32).

QUANTIZED_DTYPES = ("bfloat16", "float16", "float32")


def _check_quantize_pass(name: str, t: Tensor, out_dtype: str, blocks: int):
  if t.dtype not in QUANTIZED_DTYPES or out_dtype not in QUANTIZED_DTYPES:
    raise ValueError(f"{name}: input and output dtypes must be among {QUANTIZED_DTYPES}, got {t.dtype} -> {out_dtype}")
  if blocks % knv.BLOCK:
    raise ValueError(f"{name}: the quantized axis must be a multiple of {knv.BLOCK}, got shape {t.shape}")


def fake_quantize_rows(x: Tensor, target: Target, out_dtype: str = "bfloat16") -> Plan:
  """Plan of ``x_hat = fq(x)`` in blocks of 16 along x's last axis (a multiple of 16), as ``out_dtype``: output
  ``x_hat`` is dense, shaped like x. x must be dense rows (:func:`rows_dense`); the pass is the attention plans'
  fake-quantize launch (``fake_quantize_rows_kernel``). An empty x fills instead of launching."""
  _check_quantize_pass("fake_quantize_rows", x, out_dtype, x.shape[-1] if x.shape else 1)
  buffers = {"x": x, "x_hat": Tensor.dense(x.shape, out_dtype)}
  if x.size == 0:
    return Plan(buffers, ("x",), (), ("x_hat",), (), {"x_hat": 0.0})
  launch = dataclasses.replace(_fake_quantize(("x",), ("x_hat",), (x,), target), name="jqat_nvfp4_fake_quantize_rows")
  return Plan(buffers, ("x",), (), ("x_hat",), (launch,))


def fake_quantize_columns(w: Tensor, target: Target, out_dtype: str = "bfloat16") -> Plan:
  """Plan of ``w_hat = fq(w)`` in blocks of 16 along axis 0 of a 2-D ``w: [K, N]`` (K % 16 == 0, contiguous last
  axis, any row stride), as ``out_dtype``: output ``w_hat`` is dense ``[K, N]``. One launch of
  ``fake_quantize_cols_kernel``, which reads W as it is laid out (no transpose). An empty w fills instead."""
  if len(w.shape) != 2 or (w.size and w.strides[1] != 1):
    raise ValueError(f"fake_quantize_columns: w must be 2-D with a contiguous last axis, got shape {w.shape} "
                     f"strides {w.strides}")
  _check_quantize_pass("fake_quantize_columns", w, out_dtype, w.shape[0])
  k, n = w.shape
  w_hat = Tensor.dense(w.shape, out_dtype)
  buffers = {"w": w, "w_hat": w_hat}
  if w.size == 0:
    return Plan(buffers, ("w",), (), ("w_hat",), (), {"w_hat": 0.0})
  grid, cfg = knv.fake_quantize_cols_launch(k, n, w.strides[0], w_hat.strides[0])
  launch = Launch("jqat_nvfp4_fake_quantize_columns", knv.fake_quantize_cols_kernel, grid,
                  (Ref("w"), k, n, w.strides[0], w_hat.strides[0]), ("w_hat",),
                  {key: cfg[key] for key in ("BLOCK_R", "BLOCK_C", "EVEN", "ALIGN")} | target.quant_flags(),
                  cfg["num_warps"], cfg["num_stages"])
  return Plan(buffers, ("w",), (), ("w_hat",), (launch,))


# ----------------------------------------------------------------------------- tail RoPE + QDQ


def rope_qdq(x: Tensor, cache: Tensor, positions: Tensor, target: Target, *, heads: int, group: int, fp8: bool,
             e4m3_scale: bool, amax_floor: float) -> Plan:
  """Plan of the in-place tail RoPE + QDQ: output ``out`` is written over ``x`` (aliased).

  x: dense bf16, rows of ``width = x.shape[-1]`` channels (at least one row); cache: ``[P, 64]`` fp32
  dense; positions: dense int32/int64, one per ``heads`` consecutive rows.
  """
  width = x.shape[-1]
  n_rows = x.size // width
  assert n_rows > 0, "rope_qdq plan: nothing to launch for an empty x"
  config = krope.launch_config(width, target.quant_flags()["HW_E4M3"])
  num_warps, num_stages = config.pop("num_warps"), config.pop("num_stages")
  launch = Launch(
      "jqat_rope_qdq", krope.rope_qdq_kernel, (triton.cdiv(n_rows, config["BLOCK_R"]),),
      (Ref("x"), Ref("cache"), Ref("positions"), n_rows, cache.shape[0], heads), ("out",),
      dict(D=width, GROUP=group, FP8=bool(fp8), E4M3_SCALE=bool(e4m3_scale), AMAX_FLOOR=float(amax_floor), **config),
      num_warps, num_stages, aliases=((0, 0),))
  return Plan({"x": x, "cache": cache, "positions": positions, "out": x}, ("x", "cache", "positions"), (), ("out",),
              (launch,))


# ----------------------------------------------------------------------------- decode over a packed NVFP4 KV cache


def _pow2_divisor(values, cap: int = 16) -> int:
  """The largest power of two up to ``cap`` dividing every value (stride hints of the decode kernels)."""
  align = cap
  while align > 1 and any(v % align for v in values):
    align //= 2
  return align


def _cache_geometry(codes: Tensor, page_table: Tensor | None, batch: int) -> dict:
  """Scalars of a cache tensor's layout: ``[B, T, K, D // 2]`` or ``[pages, page_size, K, D // 2]`` with a table."""
  if page_table is None:
    return dict(capacity=codes.shape[1], pages_per_seq=1, num_pages=batch, page_size=0)
  return dict(capacity=page_table.shape[1] * codes.shape[1], pages_per_seq=page_table.shape[1],
              num_pages=codes.shape[0], page_size=codes.shape[1])


DECODE_KERNEL_ENV = "JQAT_DECODE_KERNEL"
DECODE_KERNELS = ("auto", "gluon", "triton")


def decode_kernel(q: Tensor, k_codes: Tensor, k_scales: Tensor, v_codes: Tensor, v_scales: Tensor,
                  opts: DecodeOptions, target: Target, *, paged: bool, choice: str | None = None) -> str:
  """Which split kernel a decode plan launches: "gluon" (``kernels_triton.decode_gluon``) or "triton".

  choice: "auto" (default; ``JQAT_DECODE_KERNEL`` when None): the Gluon kernel where it takes the launch
  (``decode_gluon.supported``: D, query rows, tile, page size, switches; and cache strides whose rows it can copy as
  16-byte code and whole-row scale chunks) on sm_90, where it was measured, else the Triton kernel; "gluon": the Gluon
  kernel, a ValueError where it does not take the launch; "triton": the Triton kernel. The interpreter (and any
  target without a GPU) runs the Triton kernel: Gluon kernels do not run there.
  """
  choice = choice or os.environ.get(DECODE_KERNEL_ENV) or "auto"
  if choice not in DECODE_KERNELS:
    raise ValueError(f"{DECODE_KERNEL_ENV} must be one of {DECODE_KERNELS} (or unset), got {choice!r}")
  if choice == "triton" or target.interpret or target.compute_capability is None:
    return "triton"
  d = q.shape[-1]
  rows = q.shape[2] // max(k_codes.shape[2], 1) * q.shape[1]
  page_size = k_codes.shape[1] if paged else 0
  ok = (kdg.supported(d, rows, opts.block_n, page_size, opts.config.quantize_qkv, opts.config.quantize_p,
                      target.quant_flags()["HW_E4M3"])
        and _pow2_divisor(k_codes.strides[:3] + v_codes.strides[:3]) == 16
        and _pow2_divisor(k_scales.strides[:3] + v_scales.strides[:3], d // 16) == d // 16)
  if choice == "gluon":
    if not ok:
      raise ValueError(f"{DECODE_KERNEL_ENV}=gluon: the Gluon decode kernel takes D in {kdg.HEAD_DIMS}, at most "
                       f"{kdg.MAX_ROWS} query rows per KV head, block_n {kdg.BLOCK_N}, pages of a multiple of "
                       f"{kdg.BLOCK_N} rows, quantized Q and P, sm_89+, and cache strides of whole 16-byte code chunks "
                       f"and scale rows; got D {d}, {rows} rows, block_n {opts.block_n}, page size {page_size}, "
                       f"switches {opts.config}, code strides {k_codes.strides}, scale strides {k_scales.strides}")
    return "gluon"
  return "gluon" if ok and tuple(target.compute_capability) == (9, 0) else "triton"


def decode_attention(q: Tensor, k_codes: Tensor, k_scales: Tensor, v_codes: Tensor, v_scales: Tensor,
                     kv_len: Tensor, opts: DecodeOptions, target: Target, *, page_table: Tensor | None = None,
                     out_strides=None, config: kdec.DecodeConfig | None = None, kernel: str | None = None) -> Plan:
  """Plan of decode attention over a packed NVFP4 KV cache: output ``o`` ``[B, Tq, N, D]`` in q's dtype.

  q: ``[B, Tq, N, D]`` (last axis contiguous); caches as ``kernels_triton.decode`` describes them (codes uint8,
  scales float8_e4m3fn, any strides with a contiguous last axis); kv_len: ``[B]`` int32; page_table:
  ``[B, pages_per_seq]`` int32 or None (contiguous caches). One launch of the split kernel, and with
  ``opts.num_splits > 1`` the combine launch (scratch ``part_acc``, ``part_ml``). out_strides: o's element
  strides (default dense). kernel: the split kernel, as :func:`decode_kernel` chooses it (None: its choice from
  ``JQAT_DECODE_KERNEL``); config applies to the Triton kernel."""
  b, tq, n, d = q.shape
  kh = k_codes.shape[2]
  geo = _cache_geometry(k_codes, page_table, b)
  strides = tuple(out_strides) if out_strides is not None else Tensor.dense(q.shape, q.dtype).strides
  buffers = {"q": q, "k_codes": k_codes, "k_scales": k_scales, "v_codes": v_codes, "v_scales": v_scales,
             "kv_len": kv_len, "o": Tensor(q.shape, q.dtype, strides)}
  inputs = ("q", "k_codes", "k_scales", "v_codes", "v_scales", "kv_len")
  if page_table is not None:
    buffers["page_table"] = page_table
    inputs += ("page_table",)
  if q.size == 0 or geo["capacity"] == 0 or kh == 0:
    return Plan(buffers, inputs, (), ("o",), (), {"o": 0.0})
  group = n // kh
  rows = group * tq
  gluon = decode_kernel(q, k_codes, k_scales, v_codes, v_scales, opts, target, paged=page_table is not None,
                        choice=kernel) == "gluon"
  c = config or decode_config(rows)
  block_m = kdg.block_rows(rows) if gluon else c.block_m
  row_blocks = triton.cdiv(rows, block_m)
  programs = b * kh * row_blocks
  splits = opts.num_splits
  if splits > 1:
    buffers.update(o_split=Tensor.dense((1,), q.dtype),
                   part_acc=Tensor.dense((programs, splits, block_m, d), "float32"),
                   part_ml=Tensor.dense((programs, splits, 2, block_m), "float32"))
    split_outputs, scratch = ("o_split", "part_acc", "part_ml"), ("o_split", "part_acc", "part_ml")
  else:  # the kernel writes O; the partial outputs are placeholders it never touches
    buffers.update(part_acc=Tensor.dense((1,), "float32"), part_ml=Tensor.dense((1,), "float32"))
    split_outputs, scratch = ("o", "part_acc", "part_ml"), ("part_acc", "part_ml")
  cache = (k_codes, k_scales, v_codes, v_scales)
  quant = target.quant_flags()
  constexprs = dict(
      HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=opts.block_n, PAGE_SIZE=geo["page_size"], IS_CAUSAL=opts.is_causal,
      SPLITS=splits, QUANTIZE_Q=opts.config.quantize_qkv, QUANTIZE_P=opts.config.quantize_p,
      P_ROW_RANGE=P_ROW_RANGE if opts.p_scale == "row" else 0.0, **quant, COMPILED=not target.interpret,
      CODE_ALIGN=_pow2_divisor(k_codes.strides[:3] + v_codes.strides[:3]),
      SCALE_ALIGN=_pow2_divisor(k_scales.strides[:3] + v_scales.strides[:3]))
  cache_strides = tuple(s for t in cache for s in t.strides[:3])
  if gluon:  # the token strides as constants (immediate offsets of each thread's rows), the pipeline depth, and
    # one program per group of KV heads, a warp each
    kv_group = kdg.kv_group(kh)
    constexprs.update(KC_T=k_codes.strides[1], KS_T=k_scales.strides[1], VC_T=v_codes.strides[1],
                      VS_T=v_scales.strides[1], STAGES=kdg.stages(d, block_m, kv_group), KV_GROUP=kv_group,
                      PROBE=kdg.PROBE, PACK=kdg.packs(rows))
    cache_strides = tuple(s for t in cache for s in (t.strides[0], t.strides[2]))
    grid, warps, stages, maxnreg = (programs // kv_group, splits), kv_group, 1, kdg.MAXNREG
  else:
    constexprs.update(CVT=bool(c.cvt))
    grid, warps, stages, maxnreg = (programs, splits), c.num_warps, c.num_stages, 0
  split = Launch(
      "jqat_decode_split_gluon" if gluon else "jqat_decode_split",
      kdg.decode_split_kernel if gluon else kdec.decode_split_kernel, grid,
      (Ref("q"), Ref("k_codes"), Ref("k_scales"), Ref("v_codes"), Ref("v_scales"), Ref("kv_len"),
       Ref("page_table" if page_table is not None else "kv_len"), float(opts.scale), tq, group, kh, rows, row_blocks,
       geo["capacity"], geo["pages_per_seq"], geo["num_pages"], *_s3(q), *strides[:3], *cache_strides),
      split_outputs, constexprs, warps, stages, maxnreg=maxnreg)
  launches = (split,)
  if splits > 1:
    launches += (Launch(
        "jqat_decode_combine", kdec.decode_combine_kernel,
        (programs, block_m if row_blocks > 1 else rows),
        (Ref("part_acc"), Ref("part_ml"), group, kh, rows, row_blocks, *strides[:3]), ("o",),
        dict(HEAD_DIM=d, BLOCK_M=block_m, SPLITS=splits), 4, 1),)
  return Plan(buffers, inputs, scratch, ("o",), launches)


def kv_cache_update(k_new: Tensor, v_new: Tensor, positions: Tensor, k_codes: Tensor, k_scales: Tensor,
                    v_codes: Tensor, v_scales: Tensor, target: Target, *, page_table: Tensor | None = None) -> Plan:
  """Plan of the cache write: k_new, v_new ``[B, Tn, K, D]`` (last axis contiguous) quantized into the caches at
  ``positions [B, Tn]`` int32 (dense), in place: outputs ``k_codes_out`` ... ``v_scales_out`` alias the caches."""
  b, tn, kh, d = k_new.shape
  geo = _cache_geometry(k_codes, page_table, b)
  buffers = {"k_new": k_new, "v_new": v_new, "positions": positions, "k_codes": k_codes, "k_scales": k_scales,
             "v_codes": v_codes, "v_scales": v_scales, "k_codes_out": k_codes, "k_scales_out": k_scales,
             "v_codes_out": v_codes, "v_scales_out": v_scales}
  inputs = ("k_new", "v_new", "positions", "k_codes", "k_scales", "v_codes", "v_scales")
  if page_table is not None:
    buffers["page_table"] = page_table
    inputs += ("page_table",)
  outputs = ("k_codes_out", "k_scales_out", "v_codes_out", "v_scales_out")
  n_rows = b * tn * kh
  if n_rows == 0 or geo["capacity"] == 0:  # nothing to write: the caches come back as they are
    return Plan(buffers, inputs, (), inputs[3:7], ())
  launch = kdec.write_launch(n_rows, d)
  launches = []
  for name in ("k", "v"):
    x, codes, scales = buffers[f"{name}_new"], buffers[f"{name}_codes"], buffers[f"{name}_scales"]
    args = (Ref(f"{name}_new"), Ref("positions"), Ref("page_table" if page_table is not None else "positions"),
            Ref(f"{name}_codes"), Ref(f"{name}_scales"), n_rows, tn, kh, geo["capacity"], geo["pages_per_seq"],
            geo["num_pages"], *_s3(x), *codes.strides[:3], *scales.strides[:3])
    launches.append(Launch(
        f"jqat_kv_cache_write_{name}", kdec.kv_cache_write_kernel, (triton.cdiv(n_rows, launch["BLOCK_R"]),), args,
        (f"{name}_codes_out", f"{name}_scales_out"),
        dict(HEAD_DIM=d, BLOCK_R=launch["BLOCK_R"], PAGE_SIZE=geo["page_size"],
             HW_E4M3=target.quant_flags()["HW_E4M3"]),
        launch["num_warps"], launch["num_stages"], aliases=((3, 0), (4, 1))))
  return Plan(buffers, inputs, (), outputs, tuple(launches))
