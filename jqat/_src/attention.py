"""Public QAT attention: validation, implementation dispatch and the custom VJP.

Shapes: B batch, Tq query length, Tk key length, N query heads, K key/value heads
(N % K == 0), D head dim (a multiple of 16).

Masks (all compose by AND; named as in ``jax.nn.dot_product_attention`` where it has them):
``is_causal`` with ``causal_alignment`` ("top_left": key j visible to query i iff j <= i;
"bottom_right": iff j <= i + Tk - Tq), ``local_window_size`` (left, right) around that same
diagonal, ``query_seq_lengths`` / ``key_value_seq_lengths`` int32 [B] (padding), and
``q_segment_ids`` [B, Tq] / ``kv_segment_ids`` [B, Tk] int32 (a query sees only keys of its own
segment: packed documents). A row that sees no key gives O = 0, lse = -inf and zero gradients.

Numerics modes (defined in docs/NUMERICS.md, section 7): ``p_scale`` "block" (sections 4-5) or "row"
(two-level fq(P) relative to the row max; the forward then also returns ``row_max`` [B, N, Tq]
fp32, which the backward takes); ``smooth_k`` (subtract the mean key over live keys before the op:
SageAttention's SmoothK, the softmax is unchanged in exact arithmetic); ``qkv_scale`` "block" or "tensor"
(two-level Q, K, V with an FP32 scale per (batch, head)). Every mode runs on both implementations.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jqat._src import attention_reference as reference
from jqat._src import dispatch, validate
from jqat.ffi.options import DEFAULT_BLOCK_N, AttentionOptions, QATConfig

_ALL_ON = QATConfig()  # the default switches: Attn-QAT

# The kernels pad D to the next power of two (masked loads); their shared-memory budget ends at 256.
_KERNEL_MAX_HEAD_DIM = 256


def _resolve(implementation, head_dim: int) -> str:
  unsupported = None
  if head_dim > _KERNEL_MAX_HEAD_DIM:
    unsupported = f"the Triton kernels take head dims up to {_KERNEL_MAX_HEAD_DIM}, got {head_dim}"
  return dispatch.resolve(implementation, unsupported=unsupported)


def _masks(query, key, query_seq_lengths, key_value_seq_lengths, q_segment_ids, kv_segment_ids) -> tuple:
  """The validated mask operands as int32 arrays (None where absent), in ``MASK_OPERANDS`` order.

  Values the host holds (NumPy, concrete JAX arrays) outside int32's range raise, naming the argument (they used to
  wrap: a length of 2**32 + 5 read as 5). Traced operands of a wider dtype (int64 under ``jax_enable_x64``) are
  converted exactly on the device: lengths saturate (any length at or past T means T), segment ids are renumbered
  per batch row (:func:`_renumber_segments`) when they do not fit."""
  masks = list(validate.mask_operands(query, key, query_seq_lengths, key_value_seq_lengths, q_segment_ids,
                                      kv_segment_ids))
  for i, (name, m) in enumerate(zip(validate.MASK_NAMES, masks)):
    if m is None or validate.dtype_name(m) == "int32":
      continue
    if not isinstance(m, jax.core.Tracer):
      values = np.asarray(m)
      validate.fits_int32(name, values)
      masks[i] = values.astype(np.int32)
    elif i < 2:  # a traced length: saturated into int32 (the kernels clamp it to [0, T] anyway)
      info = jnp.iinfo(m.dtype)
      masks[i] = jnp.clip(m, max(info.min, validate.INT32_MIN), min(info.max, validate.INT32_MAX))
  if any(m is not None and validate.dtype_name(m) != "int32" for m in masks[2:]):
    masks[2:] = _renumber_segments(*masks[2:])
  return tuple(None if m is None else jnp.asarray(m, jnp.int32) for m in masks)


def _renumber_segments(q_seg, kv_seg):
  """Traced segment ids ``[B, Tq]``, ``[B, Tk]`` of a dtype wider than int32 as int32 ids with the same equalities
  in every batch row: cast when every id fits, else each id's rank among the row's distinct ids (order kept, so
  sorted ids stay sorted). Exact either way; the ranks cost a sort of the row's ids, only when some id does not
  fit."""
  both = jnp.concatenate([q_seg, kv_seg], axis=1)
  tq = q_seg.shape[1]

  def ranks(ids):
    order = jnp.argsort(ids, axis=1, stable=True)
    ordered = jnp.take_along_axis(ids, order, axis=1)
    step = jnp.concatenate([jnp.zeros_like(ordered[:, :1], jnp.int32),
                            (ordered[:, 1:] != ordered[:, :-1]).astype(jnp.int32)], axis=1)
    rank = jnp.cumsum(step, axis=1, dtype=jnp.int32)
    rows = jnp.arange(ids.shape[0])[:, None]
    return jnp.zeros(ids.shape, jnp.int32).at[rows, order].set(rank)

  info = jnp.iinfo(both.dtype)
  fits = jnp.bool_(True)
  if info.min < validate.INT32_MIN:
    fits = fits & jnp.all(both >= validate.INT32_MIN)
  if info.max > validate.INT32_MAX:
    fits = fits & jnp.all(both <= validate.INT32_MAX)
  out = jax.lax.cond(fits, lambda ids: ids.astype(jnp.int32), ranks, both)
  return out[:, :tq], out[:, tq:]


def smooth_keys(key, kv_len=None):
  """SmoothK: ``key - mean(key)`` over the live keys, per batch, KV head and channel (docs/NUMERICS.md).

  key: [B, Tk, K, D]; kv_len: int32 [B] or None (all Tk keys live). The mean and the difference are FP32,
  rounded once to key's dtype. Keys at or past kv_len[b] are never read (they may hold NaN): they become 0
  and count nowhere. Subtracting one vector from every key shifts a query row's scores by one constant,
  which the softmax removes; it differentiates like any JAX function.
  """
  if key.shape[1] == 0:
    return key
  kf = key.astype(jnp.float32)
  if kv_len is None:
    return (kf - jnp.mean(kf, axis=1, keepdims=True)).astype(key.dtype)
  live = jnp.arange(key.shape[1])[None, :, None, None] < kv_len[:, None, None, None]
  count = jnp.maximum(kv_len, 1).astype(jnp.float32)[:, None, None, None]
  mean = jnp.sum(jnp.where(live, kf, 0.0), axis=1, keepdims=True) / count
  return jnp.where(live, kf - mean, 0.0).astype(key.dtype)


# The reference runs under jit even when called eagerly: dispatched op by op it would compile one XLA program
# per primitive and shape (about 140 for one call), the XLA path's main cost on CPU.
_reference_forward = jax.jit(reference.forward, static_argnames=(
    "scale", "is_causal", "block_n", "cfg", "local_window_size", "causal_alignment", "p_scale", "qkv_scale"))
_reference_backward = jax.jit(reference.backward, static_argnames=(
    "scale", "is_causal", "cfg", "local_window_size", "causal_alignment", "block_k", "p_scale", "qkv_scale"))


def _forward(query, key, value, masks, opts: AttentionOptions, impl: str):
  """``(O, O', lse, row_max)``; row_max is None unless ``p_scale == "row"``."""
  if impl == "triton":
    from jqat.ffi import jax_launch  # noqa: PLC0415  (GPU only: jax-triton needs CUDA to import)
    out = jax_launch.attention_forward(query, key, value, opts, masks)
  else:
    out = _reference_forward(query, key, value, scale=opts.scale, is_causal=opts.is_causal, block_n=opts.block_n,
                            cfg=opts.config, masks=masks, local_window_size=opts.local_window_size,
                            causal_alignment=opts.causal_alignment, p_scale=opts.p_scale,
                            qkv_scale=opts.qkv_scale)
  return tuple(out) + (None,) * (4 - len(out))


def _forward_keeping_quantized(query, key, value, masks, opts: AttentionOptions, impl: str):
  """``(O, O', lse, row_max, (q, k, v))`` with fq(X) in place of X where the Triton plan keeps it
  (``jqat.ffi.plan.kept_quantized``: fq(K), fq(V)). The custom VJP saves those instead of K and V (the same
  bytes), so its backward does not quantize them again, also where the forward and the backward are separate
  programs or loop bodies (a scan over layers), which XLA cannot merge. Same values as :func:`_forward` and
  :func:`_backward` on the inputs."""
  if impl != "triton":
    return (*_forward(query, key, value, masks, opts, impl), (query, key, value))
  from jqat.ffi import jax_launch  # noqa: PLC0415
  from jqat.ffi import plan as plans  # noqa: PLC0415
  out = jax_launch.attention_forward(query, key, value, opts, masks, keep_quantized=True)
  kept = plans.kept_quantized(opts)
  hats = dict(zip(kept, out[len(out) - len(kept):]))
  out = tuple(out[:len(out) - len(kept)])
  return (*out, *(None,) * (4 - len(out)), tuple(hats.get(name, x) for name, x in zip("qkv", (query, key, value))))


def _backward(d_out, query, key, value, out_for_delta, lse, row_max, masks, opts: AttentionOptions, impl: str,
              quantized=False):
  """quantized: the arguments are :func:`_forward_keeping_quantized`'s residuals (Triton: fq(X) where it kept it)."""
  if impl == "triton":
    from jqat.ffi import jax_launch  # noqa: PLC0415
    from jqat.ffi import plan as plans  # noqa: PLC0415
    kept = plans.kept_quantized(opts) if quantized else ()
    return jax_launch.attention_backward(d_out, query, key, value, out_for_delta, lse, opts, masks, row_max=row_max,
                                         quantized=kept)
  return _reference_backward(d_out, query, key, value, out_for_delta, lse, scale=opts.scale, is_causal=opts.is_causal,
                            cfg=opts.config, masks=masks, local_window_size=opts.local_window_size,
                            causal_alignment=opts.causal_alignment, p_scale=opts.p_scale, row_max=row_max,
                            qkv_scale=opts.qkv_scale)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _not_differentiable(name, arrays):
  return arrays


@_not_differentiable.defjvp
def _not_differentiable_jvp(name, primals, tangents):
  raise NotImplementedError(
      f"jqat.{name} is not differentiable: the explicit forward and backward are the two halves of jqat.attention's "
      "first-order rule (its backward is the Attn-QAT straight-through rule, which has no derivative of its own), "
      "and a derivative through them would depend on the implementation. Differentiate jqat.attention (jax.grad, "
      "jax.vjp) instead.")


def attention_forward(query, key, value, *, scale=None, is_causal=False, implementation=None,
                      block_n=DEFAULT_BLOCK_N, config: QATConfig = _ALL_ON, query_seq_lengths=None,
                      key_value_seq_lengths=None, q_segment_ids=None, kv_segment_ids=None, local_window_size=None,
                      causal_alignment="top_left", p_scale="block", smooth_k=False, qkv_scale="block"):
  """The explicit QAT forward.

  query: [B, Tq, N, D]; key, value: [B, Tk, K, D]; bf16 (fp16/fp32 accepted).
  Masks: as in :func:`attention`.
  Returns ``(out [B, Tq, N, D], out_high_precision [B, Tq, N, D], lse [B, N, Tq] fp32)``:
  O uses the quantized probabilities, O' the BF16 ones (for the backward's delta),
  lse is the natural-log softmax statistic (-inf for a row that sees no key).
  p_scale: "block" or "row" (docs/NUMERICS.md). With "row" a fourth output,
  ``row_max [B, N, Tq] fp32`` (the final row max of the scaled scores, -inf for a row that sees no key),
  is returned: :func:`attention_backward` needs it.
  smooth_k: run on :func:`smooth_keys` (key) (pass the same flag to :func:`attention_backward`).
  qkv_scale: "block" or "tensor" (as in :func:`attention`; the same value for the backward).
  """
  validate.attention_inputs(query, key, value)
  d = query.shape[-1]
  opts = validate.attention_options(head_dim=d, scale=scale, is_causal=is_causal, block_n=block_n, config=config,
                                    local_window_size=local_window_size, causal_alignment=causal_alignment,
                                    p_scale=p_scale, qkv_scale=qkv_scale)
  masks = _masks(query, key, query_seq_lengths, key_value_seq_lengths, q_segment_ids, kv_segment_ids)
  query, key, value = _not_differentiable("attention_forward", (query, key, value))
  if validate.flag("smooth_k", smooth_k):
    key = smooth_keys(key, masks[1])
  out = _forward(query, key, value, masks, opts, _resolve(implementation, d))
  return out if opts.p_scale == "row" else out[:3]


def attention_backward(d_out, query, key, value, out_for_delta, lse, *, scale=None, is_causal=False,
                       implementation=None, config: QATConfig = _ALL_ON, query_seq_lengths=None,
                       key_value_seq_lengths=None, q_segment_ids=None, kv_segment_ids=None, local_window_size=None,
                       causal_alignment="top_left", p_scale="block", row_max=None, smooth_k=False,
                       qkv_scale="block"):
  """The explicit QAT backward: ``(dQ, dK, dV)`` in the dtypes of query, key, value (docs/NUMERICS.md, section 5).

  d_out, out_for_delta: [B, Tq, N, D] in the query dtype; query [B, Tq, N, D]; key, value [B, Tk, K, D];
  lse: [B, N, Tq] fp32. ``out_for_delta`` is O' from :func:`attention_forward`
  (or O, for the paper's "naive FP4 forward + BF16 backward" ablation). Masks: those of the forward.
  p_scale: as in :func:`attention_forward`; with "row", ``row_max`` [B, N, Tq] fp32 is the forward's
  fourth output (required), else it must be None.
  qkv_scale: the forward's value. smooth_k: the forward's flag; dK is then the gradient of the original key
  (through :func:`smooth_keys`).
  """
  validate.attention_inputs(query, key, value)
  for name, x in (("d_out", d_out), ("out_for_delta", out_for_delta)):
    if not hasattr(x, "shape") or tuple(x.shape) != tuple(query.shape):
      raise ValueError(f"{name} must have the shape of query {tuple(query.shape)}, got {getattr(x, 'shape', x)}")
    if validate.dtype_name(x) != validate.dtype_name(query):
      raise TypeError(f"{name} must have the dtype of query ({validate.dtype_name(query)}), got "
                      f"{validate.dtype_name(x)}")
  want = (query.shape[0], query.shape[2], query.shape[1])
  if not hasattr(lse, "shape") or tuple(lse.shape) != want or validate.dtype_name(lse) != "float32":
    raise ValueError(f"lse must be float32 of shape {want} [B, N, Tq], got {getattr(lse, 'dtype', '?')} "
                     f"{getattr(lse, 'shape', lse)}")
  d = query.shape[-1]
  opts = validate.attention_options(head_dim=d, scale=scale, is_causal=is_causal, config=config,
                                    local_window_size=local_window_size, causal_alignment=causal_alignment,
                                    p_scale=p_scale, qkv_scale=qkv_scale)
  row_max = validate.row_max(row_max, query, opts.p_scale)
  masks = _masks(query, key, query_seq_lengths, key_value_seq_lengths, q_segment_ids, kv_segment_ids)
  impl = _resolve(implementation, d)
  d_out, query, key, value, out_for_delta, lse, row_max = _not_differentiable(
      "attention_backward", (d_out, query, key, value, out_for_delta, lse, row_max))
  if not validate.flag("smooth_k", smooth_k):
    return _backward(d_out, query, key, value, out_for_delta, lse, row_max, masks, opts, impl)
  smoothed, smooth_vjp = jax.vjp(lambda k: smooth_keys(k, masks[1]), key)
  d_query, d_smoothed, d_value = _backward(d_out, query, smoothed, value, out_for_delta, lse, row_max, masks, opts,
                                           impl)
  return d_query, smooth_vjp(d_smoothed)[0], d_value


@jax.custom_jvp
def _first_order_only(res, d_out):
  return res, d_out


@_first_order_only.defjvp
def _first_order_only_jvp(primals, tangents):
  raise NotImplementedError(
      "jqat.attention has first-order gradients only: its backward is the Attn-QAT straight-through rule, "
      "which has no derivative of its own. Differentiate jqat.attention once (jax.grad, jax.vjp); for "
      "higher-order derivatives use jax.nn.dot_product_attention.")


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(query, key, value, masks, opts: AttentionOptions, impl: str):
  # Nothing differentiates here (jax.grad and jax.vjp take _attention_fwd): O alone, without the O' product and
  # the residuals, which a custom call's unused outputs would still cost.
  if impl == "triton":
    from jqat.ffi import jax_launch  # noqa: PLC0415
    return jax_launch.attention_forward(query, key, value, opts, masks, residuals=False)[0]
  return _forward(query, key, value, masks, opts, impl)[0]


def _attention_fwd(query, key, value, masks, opts, impl):
  out, out_hp, lse, row_max, qkv = _forward_keeping_quantized(query, key, value, masks, opts, impl)
  # The softmax-gradient term must use O' (P @ V_hat); O = fq(P) @ V_hat only for the ablation.
  return out, (*qkv, out_hp if opts.config.high_precision_delta else out, lse, row_max, masks)


def _attention_bwd(opts, impl, res, d_out):
  *res, masks = res
  res, d_out = _first_order_only(tuple(res), d_out)
  # Integer masks have no cotangent (None: a symbolic zero).
  return (*_backward(d_out, *res, masks, opts, impl, quantized=True), tuple(None for _ in masks))


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(query, key, value, *, scale=None, is_causal=False, implementation=None, block_n=DEFAULT_BLOCK_N,
              quantize_qkv=True, quantize_p=True, high_precision_delta=True, quantize_p_backward=True,
              query_seq_lengths=None, key_value_seq_lengths=None, q_segment_ids=None, kv_segment_ids=None,
              local_window_size=None, causal_alignment="top_left", p_scale="block", smooth_k=False,
              qkv_scale="block"):
  """NVFP4 quantization-aware-training attention (Attn-QAT), differentiable (first order).

  query: [B, Tq, N, D]; key, value: [B, Tk, K, D] (N % K == 0 for GQA/MQA; D % 16 == 0); bf16
    (fp16/fp32 accepted).
  scale: softmax scale, default 1/sqrt(D). is_causal: causal mask (aligned by causal_alignment).
  query_seq_lengths, key_value_seq_lengths: int32 [B] or None (padding: rows / keys at or past the length
    are hidden). q_segment_ids: int32 [B, Tq], kv_segment_ids: int32 [B, Tk], or None (given together).
  local_window_size: None, w or (left, right): key j visible to query i iff i + o - left <= j <= i + o + right.
  causal_alignment: "top_left" (o = 0) or "bottom_right" (o = Tk - Tq), for is_causal and the window.
  implementation: None (Triton on a supported GPU, else XLA), "triton" or "xla".
  block_n: KV tile of the forward, one of 16, 32, 64, 128, 256 (the quantized P depends on it;
    both implementations use the same value).
  The four switches reproduce the paper's ablations; all False is BF16 flash attention.
  p_scale: "block" (per-16 E4M3 scales only, docs/NUMERICS.md) or "row" (two-level: probabilities scaled
    by their row max first, so long diffuse rows keep their dV; docs/NUMERICS.md).
  smooth_k: subtract the mean key over live keys (per batch, KV head, channel) before quantizing
    (:func:`smooth_keys`); the gradient flows through the mean.
  qkv_scale: "block" (E4M3 block scales only) or "tensor" (two-level: an FP32 scale per (batch, head) maps
    the amax over live rows to 6 * 448 above the block scales; docs/NUMERICS.md). Both implementations.
  Returns out: [B, Tq, N, D] in the query dtype. Gradients are straight-through
  for Q, K, V and follow docs/NUMERICS.md, section 5; higher-order derivatives raise.
  """
  validate.attention_inputs(query, key, value)
  d = query.shape[-1]
  opts = validate.attention_options(head_dim=d, scale=scale, is_causal=is_causal, block_n=block_n,
                                    quantize_qkv=quantize_qkv, quantize_p=quantize_p,
                                    high_precision_delta=high_precision_delta, quantize_p_backward=quantize_p_backward,
                                    local_window_size=local_window_size, causal_alignment=causal_alignment,
                                    p_scale=p_scale, qkv_scale=qkv_scale)
  masks = _masks(query, key, query_seq_lengths, key_value_seq_lengths, q_segment_ids, kv_segment_ids)
  if validate.flag("smooth_k", smooth_k):
    key = smooth_keys(key, masks[1])
  return _attention(query, key, value, masks, opts, _resolve(implementation, d))
