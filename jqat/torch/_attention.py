"""QAT attention on torch tensors: the host functions of both devices and the ``torch.library`` ops.

Layout BHSD as in ``F.scaled_dot_product_attention``: q ``[B, H, Sq, D]``, k, v
``[B, Hkv, Skv, D]``, lse (and, with p_scale="row", row_max) ``[B, H, Sq]`` fp32. CUDA tensors
execute the launch plans of ``jqat.ffi.plan`` (the kernels the JAX API runs inside XLA) on torch's current stream,
passing BHSD tensors as BTNH views; CPU tensors go through DLPack to the XLA reference.

``jqat::attention_fwd`` and ``jqat::attention_bwd`` are ``torch.library`` custom ops with
fake (meta) implementations and an autograd formula, so ``torch.compile`` keeps them in
its graph instead of breaking it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch

from jqat._src import attention as _api
from jqat._src import validate
from jqat.ffi import options
from jqat.ffi.options import DEFAULT_BLOCK_N, MASK_OPERANDS, AttentionOptions
from jqat.torch import _tensors as tt


def refuse_forward_ad(what: str, names, tensors) -> None:
  """Raises when a tensor carries a forward-mode tangent (``torch.func.jvp``, ``jacfwd``, ``forward_ad.make_dual``).

  The ops have reverse-mode derivatives only; under forward mode their outputs would carry no tangent, which functorch
  reads as a zero derivative (a silent all-zero jvp). Checked only inside a forward-AD level (no cost otherwise)."""
  import torch.autograd.forward_ad as fwAD  # noqa: PLC0415

  if fwAD._current_level < 0:
    return
  for name, t in zip(names, tensors):
    if isinstance(t, torch.Tensor) and fwAD.unpack_dual(t).tangent is not None:
      raise NotImplementedError(
          f"{what} has no forward-mode derivative ({name} carries a tangent: torch.func.jvp, jacfwd or forward_ad): "
          "its backward is the Attn-QAT straight-through rule, a reverse-mode formula with no forward-mode "
          "counterpart; a jvp would silently be zero. Differentiate in reverse mode (loss.backward(), "
          "torch.autograd.grad) instead.")


def check_inputs(q, k, v, *, enable_gqa: bool = True, names=("q", "k", "v")):
  """The checks of docs/API.md, section 3, on BHSD q, k, v (the shared validator, plus device and backend)."""
  for name, t in zip(names, (q, k, v)):
    tt.check_tensor(name, t)
  refuse_forward_ad("jqat.torch attention", names, (q, k, v))
  validate.attention_inputs(q, k, v, layout="BHSD", names=names, gqa=enable_gqa)
  tt.check_device(names[1], k, q.device)
  tt.check_device(names[2], v, q.device)
  tt.check_backend(q.device)


NO_MASKS = (None,) * 4  # q_len [B], kv_len [B], q_seg [B, Sq], kv_seg [B, Skv]: int32 tensors or None


@functools.cache
def _xla_forward(opts: AttentionOptions):
  """The XLA reference forward on BHSD arrays, jitted once per options value."""
  def fn(q, k, v, masks):
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
    return _api._forward(q, k, v, masks, opts, "xla")
  return jax.jit(fn)


@functools.cache
def _xla_backward(opts: AttentionOptions):
  """The XLA reference backward on BHSD arrays, jitted once per options value."""
  def fn(do, q, k, v, o_for_delta, lse, row_max, masks):
    do, q, k, v, o_for_delta = (jnp.swapaxes(t, 1, 2) for t in (do, q, k, v, o_for_delta))
    return _api._backward(do, q, k, v, o_for_delta, lse, row_max, masks, opts, "xla")
  return jax.jit(fn)


def _jax_masks(masks):
  return tuple(None if m is None else tt.to_jax(m) for m in masks)


def _mask_views(masks, launch):
  """Plan descriptions and named tensors of the present (int32, contiguous) masks."""
  named = {n: m.contiguous() for n, m in zip(MASK_OPERANDS, masks) if m is not None}
  described = tuple(None if m is None else launch.describe(m.contiguous()) for m in masks)
  return described, named


def _launcher():
  from jqat.ffi import plan as plans  # noqa: PLC0415  (imports triton; only needed on CUDA)
  from jqat.ffi import torch_launch  # noqa: PLC0415

  return plans, torch_launch


def forward(q, k, v, opts: AttentionOptions, masks=NO_MASKS):
  """BHSD q, k, v (validated) -> contiguous BHSD O, O' and lse [B, H, Sq] fp32, on the current stream;
  with ``opts.p_scale == "row"`` a fourth output, row_max [B, H, Sq] fp32 (docs/NUMERICS.md).

  masks: ``(q_len [B], kv_len [B], q_seg [B, Sq], kv_seg [B, Skv])`` int32 tensors or None (validated)."""
  b, h, sq, d = q.shape
  o = torch.empty((b, h, sq, d), dtype=q.dtype, device=q.device)
  o_hp = torch.empty_like(o)
  stats = [torch.empty((b, h, sq), dtype=torch.float32, device=q.device) for _ in range(1 + (opts.p_scale == "row"))]
  if q.device.type == "cpu":
    res = _xla_forward(opts)(*(tt.to_jax(t) for t in (q, k, v)), _jax_masks(masks))
    for dst, src in zip((o, o_hp, *stats), res):
      dst.copy_(tt.from_jax(src).transpose(1, 2) if src.ndim == 4 else tt.from_jax(src))
  else:
    forward_kernels(q, k, v, o, o_hp, stats[0], opts, masks, row_max=stats[1] if len(stats) > 1 else None)
  return (o, o_hp, *stats)


def forward_out(q, k, v, opts: AttentionOptions, masks=NO_MASKS):
  """O alone (contiguous BHSD, q's dtype), for a forward that nothing differentiates: on CUDA the plan without
  residuals (no O' product, no lse; the same O bits as :func:`forward`'s), on the CPU :func:`forward`'s O (the XLA
  reference computes the residuals either way)."""
  if q.device.type == "cpu":
    return forward(q, k, v, opts, masks)[0]
  o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
  forward_kernels(q, k, v, o, None, None, opts, masks, residuals=False)
  return o


def forward_kernels(q, k, v, o, o_hp, lse, opts: AttentionOptions, masks=NO_MASKS, row_max=None, residuals=True):
  """The forward plan into ``o``, ``o_hp`` (BHSD, equal strides), ``lse`` and, with p_scale="row", ``row_max``
  (contiguous); CUDA, or CPU tensors under ``TRITON_INTERPRET=1``. residuals=False: into ``o`` alone (o_hp, lse
  and row_max None), the plan without the O' product."""
  plans, launch = _launcher()
  q, k, v = tt.dense(q), tt.dense(k), tt.dense(v)
  views = dict(q=tt.btnh(q), k=tt.btnh(k), v=tt.btnh(v), o=tt.btnh(o))
  if residuals:
    views.update(o_hp=tt.btnh(o_hp), lse=lse, row_max=row_max)
  described, named = _mask_views(masks, launch)
  views.update(named)
  plan = plans.attention_forward(*(launch.describe(views[n]) for n in ("q", "k", "v")), opts, launch.target(q),
                                 out_strides=views["o"].stride(), masks=described, residuals=residuals)
  views.update(launch.allocate(plan, plan.scratch, q.device))
  launch.execute(plan, views)


def backward_plan(do, q, k, v, o_for_delta, lse, opts: AttentionOptions, masks=NO_MASKS, row_max=None):
  """The backward's plan and the BTNH views of its inputs (``q, k, v`` dense, ``do``/``o_for_delta`` readable
  in place (``tt.readable``), ``lse`` and ``row_max`` (p_scale="row" only) contiguous: copies only where a tensor
  is not already so)."""
  plans, launch = _launcher()
  views = dict(do=tt.readable(do), q=tt.dense(q), k=tt.dense(k), v=tt.dense(v), o_for_delta=tt.readable(o_for_delta))
  views = {n: tt.btnh(t) for n, t in views.items()}
  views["lse"] = lse.contiguous()
  if row_max is not None:
    views["row_max"] = row_max.contiguous()
  described, named = _mask_views(masks, launch)
  views.update(named)
  plan = plans.attention_backward(*(launch.describe(views[n]) for n in ("do", "q", "k", "v", "o_for_delta", "lse")),
                                  opts, launch.target(q), masks=described,
                                  row_max=None if row_max is None else launch.describe(views["row_max"]))
  return plan, views


def backward(do, q, k, v, o_for_delta, lse, opts: AttentionOptions, *, out=None, workspace=None, masks=NO_MASKS,
             row_max=None):
  """BHSD (dq, dk, dv) of validated inputs on the current stream; masks as in :func:`forward`; row_max: the
  forward's fourth output with p_scale="row", else None.

  out: optional (dq, dk, dv) buffers to write (on CUDA with the strides of the dense q, k, v); workspace:
  optional 1-D uint8 scratch (:func:`jqat.ffi.torch_launch.workspace_bytes` of the plan), else allocated.
  """
  if q.device.type == "cpu":
    grads = _xla_backward(opts)(*(tt.to_jax(t) for t in (do, q, k, v, o_for_delta, lse)),
                                None if row_max is None else tt.to_jax(row_max), _jax_masks(masks))
    out = out or tuple(torch.empty_like(t) for t in (q, k, v))
    for dst, src in zip(out, grads):
      dst.copy_(tt.from_jax(src).transpose(1, 2))
    return tuple(out)
  return backward_kernels(do, q, k, v, o_for_delta, lse, opts, out=out, workspace=workspace, masks=masks,
                          row_max=row_max)


def backward_kernels(do, q, k, v, o_for_delta, lse, opts: AttentionOptions, *, out=None, workspace=None,
                     masks=NO_MASKS, row_max=None):
  """The backward plan (arguments as :func:`backward`); CUDA, or CPU tensors under ``TRITON_INTERPRET=1``."""
  plan, views = backward_plan(do, q, k, v, o_for_delta, lse, opts, masks, row_max)
  _, launch = _launcher()
  if out is None:
    out = tuple(tt.btnh(g) for g in launch.allocate(plan, plan.outputs, q.device).values())
  views.update(zip(("dq", "dk", "dv"), (tt.btnh(g) for g in out)))
  views.update(launch.carve(plan, workspace) if workspace is not None else
               launch.allocate(plan, plan.scratch, q.device))
  launch.execute(plan, views)
  return tuple(out)


# The ops' static arguments after the tensors: AttentionOptions as scalars (the schema has no tuples or
# dataclasses), named and typed by the fields (jqat.ffi.options.scalar_fields), so a new option needs no edit here.
_STATIC = options.scalar_fields(AttentionOptions)
_MASKS = ", ".join(f"Tensor? {name}" for name in MASK_OPERANDS)


def _op(name: str, tensors: str, returns: str):
  """A ``jqat::name`` custom op taking ``tensors``, the optional masks and the static options, in that order."""
  static = ", ".join(f"{kind.__name__} {arg}" for arg, kind in _STATIC)
  return torch.library.custom_op(f"jqat::{name}", mutates_args=(),
                                 schema=f"({tensors}, {_MASKS}, {static}) -> {returns}")


@functools.cache
def _options(static: tuple) -> AttentionOptions:
  return options.from_scalars(AttentionOptions, static)


@_op("attention_fwd", "Tensor q, Tensor k, Tensor v", "(Tensor, Tensor, Tensor, Tensor)")
def attention_fwd_op(q, k, v, q_len, kv_len, q_seg, kv_seg, *static):
  """``(O, O', lse, row_max)``: contiguous BHSD outputs in q's dtype, lse [B, H, Sq] fp32 and row_max [B, H, Sq]
  fp32 with p_scale="row" (an empty [0] tensor with "block": a custom op has a fixed output count)."""
  tt.check_backend(q.device)
  o, o_hp, lse, *row_max = forward(q, k, v, _options(static), (q_len, kv_len, q_seg, kv_seg))
  return o, o_hp, lse, row_max[0] if row_max else lse.new_empty((0,))


@attention_fwd_op.register_fake
def _(q, k, v, q_len, kv_len, q_seg, kv_seg, *static):
  o = q.new_empty(q.shape)  # contiguous, as forward() allocates
  row = _options(static).p_scale == "row"
  return (o, torch.empty_like(o), q.new_empty(q.shape[:3], dtype=torch.float32),
          q.new_empty(q.shape[:3] if row else (0,), dtype=torch.float32))


@_op("attention_out", "Tensor q, Tensor k, Tensor v", "Tensor")
def attention_out_op(q, k, v, q_len, kv_len, q_seg, kv_seg, *static):
  """O alone (contiguous BHSD, q's dtype): ``attention_fwd``'s O where nothing differentiates (no backward)."""
  tt.check_backend(q.device)
  return forward_out(q, k, v, _options(static), (q_len, kv_len, q_seg, kv_seg))


@attention_out_op.register_fake
def _(q, k, v, q_len, kv_len, q_seg, kv_seg, *static):
  return q.new_empty(q.shape)


@_op("attention_bwd", "Tensor do, Tensor q, Tensor k, Tensor v, Tensor o_for_delta, Tensor lse, Tensor? row_max",
     "(Tensor, Tensor, Tensor)")
def attention_bwd_op(do, q, k, v, o_for_delta, lse, row_max, q_len, kv_len, q_seg, kv_seg, *static):
  """``(dQ, dK, dV)`` with the layouts of q, k, v (``torch.empty_like``); row_max given with p_scale="row"."""
  opts = _options(static)
  out = tuple(torch.empty_like(t) for t in (q, k, v))
  if q.device.type == "cuda":  # the kernels write gradients with the strides of the (dense) operand they read
    out = tuple(o if tt.is_dense(t) else torch.empty_like(o, memory_format=torch.contiguous_format)
                for o, t in zip(out, (q, k, v)))
  return backward(do, q, k, v, o_for_delta, lse, opts, out=out, masks=(q_len, kv_len, q_seg, kv_seg),
                  row_max=row_max)


@attention_bwd_op.register_fake
def _(do, q, k, v, o_for_delta, lse, row_max, q_len, kv_len, q_seg, kv_seg, *static):
  return tuple(torch.empty_like(t) if tt.is_dense(t) else torch.empty_like(t, memory_format=torch.contiguous_format)
               for t in (q, k, v))


def _setup_context(ctx, inputs, output):
  q, k, v, *rest = inputs
  masks, static = rest[:4], tuple(rest[4:])
  o, o_hp, lse, row_max = output
  ctx.save_for_backward(q, k, v, o_hp if _options(static).config.high_precision_delta else o, lse, row_max, *masks)
  ctx.static = static
  ctx.mark_non_differentiable(o_hp, lse, row_max)


def _backward_formula(ctx, d_out, d_out_hp, d_lse, d_row_max):
  del d_out_hp, d_lse, d_row_max  # O', lse and row_max are statistics of the forward, not differentiated
  q, k, v, o_for_delta, lse, row_max, *masks = ctx.saved_tensors
  row_max = row_max if _options(ctx.static).p_scale == "row" else None
  dq, dk, dv = attention_bwd_op(d_out, q, k, v, o_for_delta, lse, row_max, *masks, *ctx.static)
  return (dq, dk, dv) + (None,) * (len(masks) + len(ctx.static))  # integer masks: no gradient


attention_fwd_op.register_autograd(_backward_formula, setup_context=_setup_context)


def int32_masks(masks, *, host_check=None):
  """Validated integer masks ``(q_len, kv_len, q_seg, kv_seg)`` (tensors or None) as contiguous int32 tensors.

  Values outside int32's range would wrap (a length of 2**32 + 5 read as 5). Where the host holds them (CPU tensors,
  outside torch.compile; ``host_check`` overrides) they raise, naming the argument. Elsewhere (CUDA: checking would
  need a sync) they are converted exactly on the device: lengths saturate (a length at or past S means S), and
  segment ids wider than int32 (torch's default int64) are renumbered per batch row by their rank among the row's
  distinct ids, which keeps every equality and the order (one sort of the row's ids; pass int32 ids to skip it).
  """
  masks = list(masks)
  if host_check is None:
    host_check = not torch.compiler.is_compiling()
  wide = lambda m: m is not None and m.dtype != torch.int32
  for i, (name, m) in enumerate(zip(validate.MASK_NAMES, masks)):
    if not wide(m):
      continue
    if host_check and m.device.type == "cpu":
      validate.fits_int32(name, m.numpy())
      masks[i] = m.to(torch.int32)
    elif i < 2:
      info = torch.iinfo(m.dtype)
      masks[i] = m.clamp(max(info.min, validate.INT32_MIN), min(info.max, validate.INT32_MAX)).to(torch.int32)
  if wide(masks[2]) or wide(masks[3]):
    q_seg, kv_seg = masks[2:]
    if max(torch.iinfo(q_seg.dtype).max, torch.iinfo(kv_seg.dtype).max) <= validate.INT32_MAX and \
        min(torch.iinfo(q_seg.dtype).min, torch.iinfo(kv_seg.dtype).min) >= validate.INT32_MIN:
      masks[2:] = q_seg.to(torch.int32), kv_seg.to(torch.int32)  # int8/int16/uint8: every value fits
    else:
      both = torch.cat([q_seg.to(torch.int64), kv_seg.to(torch.int64)], dim=1)
      ordered, order = torch.sort(both, dim=1, stable=True)
      step = torch.ones_like(ordered, dtype=torch.int32)
      step[:, :1] = 0
      step[:, 1:] = (ordered[:, 1:] != ordered[:, :-1]).to(torch.int32)
      rank = torch.empty_like(step).scatter_(1, order, torch.cumsum(step, dim=1, dtype=torch.int32))
      masks[2:] = rank[:, :q_seg.shape[1]], rank[:, q_seg.shape[1]:]
  return tuple(None if m is None else m.contiguous() for m in masks)


def smooth_keys(k, kv_len=None):
  """``jqat.attention``'s SmoothK on BHSD ``k`` [B, Hkv, Skv, D]: minus the FP32 mean over the live keys
  (``kv_len`` [B] or None), rounded once to k's dtype; keys past kv_len[b] become 0 (docs/NUMERICS.md)."""
  if k.shape[2] == 0:
    return k
  kf = k.float()
  if kv_len is None:
    return (kf - kf.mean(dim=2, keepdim=True)).to(k.dtype)
  live = torch.arange(k.shape[2], device=k.device)[None, None, :, None] < kv_len[:, None, None, None]
  count = kv_len.clamp(min=1).float()[:, None, None, None]
  mean = torch.where(live, kf, 0.0).sum(dim=2, keepdim=True) / count
  return torch.where(live, kf - mean, 0.0).to(k.dtype)


def attention(q, k, v, is_causal=False, scale=None, enable_gqa=False, *, block_n=DEFAULT_BLOCK_N,
              quantize_qkv=True, quantize_p=True, high_precision_delta=True, quantize_p_backward=True,
              query_seq_lengths=None, key_value_seq_lengths=None, q_segment_ids=None, kv_segment_ids=None,
              local_window_size=None, causal_alignment="top_left", p_scale="block", smooth_k=False,
              qkv_scale="block"):
  """NVFP4 quantization-aware-training attention (Attn-QAT) on BHSD tensors, differentiable.

  Drop-in for ``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=..., enable_gqa=...)``
  without ``attn_mask`` / ``dropout_p``.

  q: [B, H, Sq, D]; k, v: [B, Hkv, Skv, D]; bf16 (fp16/fp32 accepted); D % 16 == 0.
  Without ``enable_gqa`` H must equal Hkv; with it H % Hkv == 0 (query head h reads KV head h // (H // Hkv)).
  is_causal: top-left aligned (key j visible to query i iff j <= i), as in JAX and SDPA.
  scale: softmax scale, default 1/sqrt(D).
  block_n: KV tile of the forward (the quantized P depends on it), as in ``jqat.attention``.
  quantize_qkv, quantize_p, high_precision_delta, quantize_p_backward: the paper's ablation
    switches (docs/NUMERICS.md, section 6); all False is plain BF16 flash attention.
  query_seq_lengths, key_value_seq_lengths: integer [B] (padding); q_segment_ids [B, Sq], kv_segment_ids [B, Skv]
    integer (packed documents); local_window_size, causal_alignment: as in ``jqat.attention`` (there
    ``is_causal`` follows ``causal_alignment`` too). Integer masks are passed to the kernels as int32.
  p_scale: "block" or "row" (two-level fq(P), docs/NUMERICS.md), as in ``jqat.attention``.
  smooth_k: subtract the mean key over live keys first (:func:`smooth_keys`, a torch op: autograd
    carries its gradient), as in ``jqat.attention``.
  qkv_scale: "block" or "tensor" (per-(batch, head) FP32 scales above the block scales, amax over the live
    rows; docs/NUMERICS.md), as in ``jqat.attention``, on both devices.

  Returns O [B, H, Sq, D] in q's dtype. CUDA tensors run the Triton kernels on the current
  stream; CPU tensors run the JAX reference through DLPack. The op is ``torch.ops.jqat.attention_fwd``
  (a ``torch.library`` custom op with a registered backward), so ``torch.compile`` traces
  through it without a graph break; where nothing differentiates (grad disabled, or no input that
  requires grad) it is ``torch.ops.jqat.attention_out``, the same O without the backward's residuals.
  """
  check_inputs(q, k, v, enable_gqa=validate.flag("enable_gqa", enable_gqa))
  static = options.keyword_scalars(
      head_dim=q.shape[-1], scale=scale, is_causal=is_causal, block_n=block_n, quantize_qkv=quantize_qkv,
      quantize_p=quantize_p, high_precision_delta=high_precision_delta, quantize_p_backward=quantize_p_backward,
      local_window_size=local_window_size, causal_alignment=causal_alignment, p_scale=p_scale, qkv_scale=qkv_scale)
  masks = validate.mask_operands(q, k, query_seq_lengths, key_value_seq_lengths, q_segment_ids, kv_segment_ids,
                                 layout="BHSD")
  for name, m in zip(validate.MASK_NAMES, masks):
    if m is not None:
      tt.check_device(name, m, q.device)
  masks = int32_masks(masks)
  if validate.flag("smooth_k", smooth_k):
    k = smooth_keys(k, masks[1])
  args = (q, k, v, *masks, *static)
  if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
    return attention_fwd_op(*args)[0]
  return attention_out_op(*args)  # nothing to differentiate: O alone, without the backward's residuals
