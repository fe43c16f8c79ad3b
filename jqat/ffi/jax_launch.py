"""The JAX binding: executes launch plans (``jqat.ffi.plan``) as jax-triton custom calls inside XLA.

Every buffer is an XLA buffer: row-major and 16-byte aligned (jax-triton's assumption),
so plans are built from dense :class:`~jqat.ffi.plan.Tensor` descriptions. jax-triton's
primitive has no batching rule, so the attention entry points are
``jax.custom_batching.custom_vmap`` functions whose rule folds the vmapped axis into the
batch axis B (every operand leads with B, lse included): exactly a larger batch for the
kernels. Nor has it a partitioning rule: inside the vmap rule, each op's per-shard
function is wrapped by ``jqat.ffi.partitioning`` (batch- and head-sharded inputs run the plan
on the local shard, no collectives). With ``JQAT_JAX_LAUNCHER=callback`` each launch is instead a
``buffer_callback`` that launches Triton's cubin (``jqat.ffi.callback_launch``); everything above holds.
"""

from __future__ import annotations

import functools
import math
import os
import warnings

import jax
import jax.numpy as jnp

from jqat.ffi import callback_launch, partitioning
from jqat.ffi import plan as plans
from jqat.ffi.options import AttentionOptions
from jqat.ffi.triton_call import compiles_gluon, triton_call


@functools.cache
def target(launcher: str = "jax-triton") -> plans.Target:
  """The default JAX device as a plan target of ``launcher`` ("jax-triton" or "callback")."""
  cc = getattr(jax.devices()[0], "compute_capability", None)
  if isinstance(cc, str):
    major, _, minor = cc.partition(".")
    cc = (int(major), int(minor or 0))
  # Without a GPU only the callback launcher can run a plan: in Triton's interpreter.
  return plans.Target(cc, interpret=cc is None and launcher == "callback")


def dense(x) -> plans.Tensor:
  return plans.Tensor.dense(x.shape, jnp.dtype(x.dtype).name)


def execute(plan: plans.Plan, *arrays, launcher: str | None = None) -> tuple:
  """Runs ``plan`` on ``arrays`` (its inputs, in order); returns its outputs.

  launcher: "jax-triton" (each launch a jax-triton custom call) or "callback" (a ``buffer_callback``
  launching Triton's cubin, ``jqat.ffi.callback_launch``); None: ``JQAT_JAX_LAUNCHER``'s choice.
  """
  launcher = launcher or callback_launch.launcher()
  env = dict(zip(plan.inputs, arrays))
  for name, value in plan.fills.items():
    t = plan.buffers[name]
    env[name] = jnp.full(t.shape, value, t.dtype)
  for launch in plan.launches:
    args = tuple(env[a.name] if isinstance(a, plans.Ref) else a for a in launch.args)
    out_shape = tuple(jax.ShapeDtypeStruct(plan.buffers[o].shape, plan.buffers[o].dtype) for o in launch.outputs)
    # Both launchers number aliased inputs among the array operands (scalars are not operands).
    aliases = {sum(isinstance(a, plans.Ref) for a in launch.args[:i]): o for i, o in launch.aliases}
    if launcher == "callback":
      res = callback_launch.launch(launch, args, out_shape, aliases, target(launcher))
    else:
      res = triton_call(*args, kernel=launch.kernel, out_shape=out_shape if len(out_shape) > 1 else out_shape[0],
                        grid=launch.grid, num_warps=launch.num_warps, num_stages=launch.num_stages,
                        input_output_aliases=aliases, name=launch.name, maxnreg=launch.maxnreg, **launch.constexprs)
      res = res if len(out_shape) > 1 else (res,)
    env.update(zip(launch.outputs, res))
  return tuple(env[o] for o in plan.outputs)


def fold_batch(fun, num_args: int):
  """``custom_vmap`` of ``fun(*arrays) -> tuple of arrays`` whose every array leads with B.

  Under vmap the mapped axis (moved to the front by JAX) is merged into B:
  ``[V, B, ...] -> [V * B, ...]``; unbatched operands are broadcast first.
  """
  folded = jax.custom_batching.custom_vmap(fun)

  @folded.def_vmap
  def _rule(axis_size, in_batched, *args):
    assert len(args) == num_args
    flat = []
    for x, batched in zip(args, in_batched):
      if not batched:
        x = jnp.broadcast_to(x, (axis_size,) + x.shape)
      flat.append(x.reshape((axis_size * x.shape[1],) + x.shape[2:]))
    outs = folded(*flat)  # the same custom_vmap function, so nested vmaps fold again
    outs = tuple(o.reshape((axis_size, o.shape[0] // axis_size) + o.shape[1:]) for o in outs)
    return outs, tuple(True for _ in outs)

  return folded


def _mask_tensors(present, arrays):
  """Plan tensors of the mask operands in ``MASK_OPERANDS`` order: ``arrays`` are the present ones."""
  it = iter(arrays)
  return tuple(dense(next(it)) if p else None for p in present)


def _partitioned(run, spec: partitioning.OpSpec, launcher: str):
  """``run`` with its partitioning rule; without one for the callback launcher, whose sharded inputs XLA gathers.

  custom_partitioning lowers the per-shard function into a module of its own, whose host callbacks are
  dropped: the program would call a callback that is not there (seen: a segfault on two CPU devices).
  """
  if launcher != "callback":
    return partitioning.partitioned(run, spec)
  if jax.device_count() > 1:
    warnings.warn(f"{callback_launch.ENV}=callback has no partitioning rule: under jit, XLA gathers sharded operands "
                  "of jqat's ops onto every device (correct, but each device does all the work); inside jax.shard_map "
                  "each device runs its own shard", RuntimeWarning, stacklevel=3)
  return run


# The op functions are cached per launcher too: JAX caches what it traced of a function, so one function
# object per launcher keeps a trace for one launcher from serving the other.
@functools.cache
def _forward_fn(opts: AttentionOptions, config, present: tuple[bool, ...], launcher: str, kept: tuple[str, ...],
                residuals: bool = True):
  def run(q, k, v, *masks):  # on the local shard: the plan is built from the shapes it sees
    plan = plans.attention_forward(dense(q), dense(k), dense(v), opts, target(launcher), config=config,
                                   masks=_mask_tensors(present, masks), keep_quantized=bool(kept),
                                   residuals=residuals)
    return execute(plan, q, k, v, *masks, launcher=launcher)
  spec = partitioning.attention_forward_spec(present, row_max=opts.p_scale == "row", kept=kept, residuals=residuals)
  return fold_batch(_partitioned(run, spec, launcher), 3 + sum(present))


@functools.cache
def _backward_fn(opts: AttentionOptions, config, present: tuple[bool, ...], launcher: str,
                 quantized: tuple[str, ...]):
  row = opts.p_scale == "row"

  def run(do, q, k, v, o_for_delta, lse, *rest):  # rest: row_max (p_scale="row"), then the masks
    stats, masks = rest[:int(row)], rest[int(row):]
    plan = plans.attention_backward(*map(dense, (do, q, k, v, o_for_delta, lse)), opts, target(launcher),
                                    config=config, masks=_mask_tensors(present, masks),
                                    row_max=dense(stats[0]) if row else None,
                                    q_hat_over_out=True,  # O' is dead after delta: XLA keeps any other reader safe
                                    quantized=quantized)
    return execute(plan, do, q, k, v, o_for_delta, lse, *stats, *masks, launcher=launcher)
  spec = partitioning.attention_backward_spec(present, row_max=row)
  return fold_batch(_partitioned(run, spec, launcher), 6 + row + sum(present))


def attention_forward(query, key, value, opts: AttentionOptions, masks=plans.NO_MASKS, *, keep_quantized=False,
                      residuals=True):
  """QAT forward on the GPU: ``(O, O', lse)``; with ``residuals=False`` just ``(O,)``, the same O without the O'
  product (``jqat.ffi.plan.attention_forward``).

  query: [B, Tq, N, D]; key, value: [B, Tk, K, D] (N % K == 0, D % 16 == 0), one float dtype.
  masks: ``(q_len [B], kv_len [B], q_seg [B, Tq], kv_seg [B, Tk])`` int32, each optional (None); they lead
  with B like every other operand, so vmap folds them into the batch too.
  Returns O, O' [B, Tq, N, D] in the query dtype and lse [B, N, Tq] fp32; with ``opts.p_scale == "row"``
  also row_max [B, N, Tq] fp32. keep_quantized: then also fq(X) for each X of ``jqat.ffi.plan.kept_quantized``
  (fq(K), fq(V): the quantize passes' outputs, which :func:`attention_backward` takes as ``quantized``).
  """
  present = tuple(m is not None for m in masks)
  kept = plans.kept_quantized(opts) if keep_quantized else ()
  fn = _forward_fn(opts, plans.forward_config(query.shape[-1], residuals), present, callback_launch.launcher(), kept,
                   residuals)
  return fn(query, key, value, *(m for m in masks if m is not None))


def attention_backward(d_out, query, key, value, out_for_delta, lse, opts: AttentionOptions, masks=plans.NO_MASKS, *,
                       row_max=None, quantized: tuple[str, ...] = ()):
  """QAT backward on the GPU: ``(dQ, dK, dV)`` in the dtypes of query, key, value.

  d_out, out_for_delta: [B, Tq, N, D]; query [B, Tq, N, D]; key, value [B, Tk, K, D];
  lse (and, with p_scale="row", row_max): [B, N, Tq] fp32 from :func:`attention_forward`; masks: those of
  the forward. quantized: the names among k, v whose argument is the forward's fq(X) (``keep_quantized``).
  """
  present = tuple(m is not None for m in masks)
  config = plans.backward_config(query.shape[-1], opts.local_window_size is not None)
  fn = _backward_fn(opts, config, present, callback_launch.launcher(), tuple(quantized))
  stats = (row_max,) if opts.p_scale == "row" else ()
  return fn(d_out, query, key, value, out_for_delta, lse, *stats, *(m for m in masks if m is not None))


@functools.cache
def _rope_qdq_fn(x_rank: int, positions_rank: int, group: int, fp8: bool, e4m3_scale: bool, amax_floor: float,
                 launcher: str):
  def run(x, cache, positions):  # on the local shard: heads are x's axes past positions' (1 or the local H)
    heads = math.prod(x.shape[positions_rank:-1])
    plan = plans.rope_qdq(dense(x), dense(cache), dense(positions.reshape(-1)), target(launcher), heads=heads,
                          group=group, fp8=fp8, e4m3_scale=e4m3_scale, amax_floor=amax_floor)
    return execute(plan, x, cache, positions.reshape(-1), launcher=launcher)
  return _partitioned(run, partitioning.rope_qdq_spec(x_rank, positions_rank), launcher)


def rope_qdq(x, cache, positions, *, heads: int, group: int, fp8: bool, e4m3_scale: bool, amax_floor: float):
  """x: [..., width] bf16 (rows flattened, at least one); cache: [P, 64] fp32; positions: [rows // heads] int32/int64.

  heads: 1 (one position per row) or x.shape[1] of an [N, H, width] x (one per token).
  Returns the QDQ result in x's buffer: output 0 aliases input 0, so under
  ``jax.jit(..., donate_argnums=...)`` on one device no new buffer is allocated.
  """
  # Positions shaped like x's token axes, so that a row-sharded x takes its positions' shard.
  positions_rank = 1 if heads > 1 else x.ndim - 1
  if heads > 1 and (x.ndim != 3 or x.shape[1] != heads):
    raise ValueError(f"rope_qdq: x must be [N, H={heads}, width] when heads > 1, got {tuple(x.shape)}")
  fn = _rope_qdq_fn(x.ndim, positions_rank, group, bool(fp8), bool(e4m3_scale), float(amax_floor),
                    callback_launch.launcher())
  return fn(x, cache, positions.reshape(x.shape[:positions_rank]))[0]


def _no_vmap(fun, op: str):
  """``fun`` whose vmap raises a clear error (a paged cache does not lead with the batch axis to fold into)."""
  wrapped = jax.custom_batching.custom_vmap(fun)

  @wrapped.def_vmap
  def _rule(axis_size, in_batched, *args):
    raise NotImplementedError(f"jqat.{op} with a page_table has no vmap rule: the page pool is shared by the batch; "
                              "fold the mapped axis into the batch (and the page table) instead")

  return wrapped


@functools.cache
def _decode_fn(opts, config, paged: bool, launcher: str, kernel: str):
  def run(q, kc, ks, vc, vs, kv_len, *table):  # on the local shard
    if launcher == "callback":  # buffer_callback takes no float8 buffer: the scales as bytes (the kernels read bytes)
      ks, vs = (jax.lax.bitcast_convert_type(x, jnp.uint8) for x in (ks, vs))
    plan = plans.decode_attention(dense(q), dense(kc), dense(ks), dense(vc), dense(vs), dense(kv_len), opts,
                                  target(launcher), page_table=dense(table[0]) if paged else None, config=config,
                                  kernel=kernel)
    return execute(plan, q, kc, ks, vc, vs, kv_len, *table, launcher=launcher)
  fn = _partitioned(run, partitioning.decode_spec(paged), launcher)
  return _no_vmap(fn, "decode_attention") if paged else fold_batch(fn, 6)


def decode_attention(query, k_cache, v_cache, kv_lengths, opts, page_table=None):
  """Decode attention on the GPU (``jqat.ffi.plan.decode_attention``): O [B, Tq, N, D] in the query dtype.

  query [B, Tq, N, D]; k_cache, v_cache: ``(codes, scales)``; kv_lengths [B] int32; page_table [B, P] int32 or None.
  The Gluon split kernel (``jqat.ffi.plan.decode_kernel``) is a custom call like every other launch where jqat's
  wrapper of jax-triton compiles Gluon kernels (``triton_call.compiles_gluon``: jax-triton 0.3.1); with another
  jax-triton the automatic choice is the Triton kernel, and ``JQAT_DECODE_KERNEL=gluon`` runs the Gluon kernel
  through the callback launcher (no partitioning rule there).
  """
  rows = query.shape[2] // k_cache[0].shape[2] * query.shape[1]
  launcher = callback_launch.launcher()
  kernel = plans.decode_kernel(dense(query), *map(dense, (*k_cache, *v_cache)), opts, target(launcher),
                               paged=page_table is not None)
  if kernel == "gluon" and launcher == "jax-triton" and not compiles_gluon():
    automatic = os.environ.get(plans.DECODE_KERNEL_ENV, "auto") in ("", "auto")
    kernel, launcher = ("triton", launcher) if automatic else ("gluon", "callback")
  fn = _decode_fn(opts, plans.decode_config(rows), page_table is not None, launcher, kernel)
  table = () if page_table is None else (page_table,)
  return fn(query, *k_cache, *v_cache, kv_lengths, *table)[0]


@functools.cache
def _cache_update_fn(paged: bool, launcher: str):
  def run(k_new, v_new, positions, kc, ks, vc, vs, *table):
    plan = plans.kv_cache_update(dense(k_new), dense(v_new), dense(positions), dense(kc), dense(ks), dense(vc),
                                 dense(vs), target(launcher), page_table=dense(table[0]) if paged else None)
    return execute(plan, k_new, v_new, positions, kc, ks, vc, vs, *table, launcher=launcher)
  fn = _partitioned(run, partitioning.kv_cache_update_spec(paged), launcher)
  return _no_vmap(fn, "kv_cache_update") if paged else fold_batch(fn, 7)


def kv_cache_update(k_cache, v_cache, k_new, v_new, positions, page_table=None):
  """The cache write on the GPU (``jqat.ffi.plan.kv_cache_update``): ``(k_cache, v_cache)`` with k_new, v_new
  [B, Tn, K, D] quantized in at positions [B, Tn] int32; each output aliases its input (in place when donated)."""
  fn = _cache_update_fn(page_table is not None, callback_launch.launcher())
  table = () if page_table is None else (page_table,)
  kc, ks, vc, vs = fn(k_new, v_new, positions, *k_cache, *v_cache, *table)
  return (kc, ks), (vc, vs)


@functools.cache
def _fake_quantize_fn(axis: int, rank: int, out_dtype: str, launcher: str):
  def run(blocks):  # on the local shard, in NVFP4 blocks: x [..., Q, 16] or w [Q, 16, N]
    if axis == 0:
      flat = blocks.reshape((blocks.shape[0] * blocks.shape[1],) + blocks.shape[2:])
      plan = plans.fake_quantize_columns(dense(flat), target(launcher), out_dtype)
    else:
      flat = blocks.reshape(blocks.shape[:-2] + (blocks.shape[-2] * blocks.shape[-1],))
      plan = plans.fake_quantize_rows(dense(flat), target(launcher), out_dtype)
    return tuple(out.reshape(blocks.shape) for out in execute(plan, flat, launcher=launcher))
  # Under vmap the mapped axis folds into the leading one: more rows of x, or more blocks of 16 along w's K (a
  # block never straddles two of the stacked matrices, K % 16 == 0).
  return fold_batch(_partitioned(run, partitioning.fake_quantize_spec(rank, axis), launcher), 1)


def fake_quantize(x, axis: int, out_dtype="bfloat16"):
  """fq(x) by the Triton quantize pass of ``jqat.ffi.plan.fake_quantize_rows`` (``axis=-1``: x ``[..., K]``, rank
  >= 1) or ``fake_quantize_columns`` (``axis=0``: x ``[K, N]``), K % 16 == 0; returned as ``out_dtype``, x's shape.

  The op takes x split into NVFP4 blocks (``[..., K // 16, 16]`` or ``[K // 16, 16, N]``, free reshapes), so its
  partitioning rule (``jqat.ffi.partitioning.fake_quantize_spec``) keeps every axis local but the 16 elements of a
  block: a shard of whole blocks along K quantizes as the whole tensor does.
  """
  if axis not in (0, -1) or (axis == 0 and x.ndim != 2) or x.ndim < 1 or x.shape[axis] % 16:
    raise ValueError(f"fake_quantize: axis -1 of an x of rank >= 1 or axis 0 of a 2-D x, K % 16 == 0; got axis {axis}, "
                     f"shape {x.shape}")
  out_dtype = jnp.dtype(out_dtype).name
  k = x.shape[axis]
  blocks = x.reshape((k // 16, 16, x.shape[1]) if axis == 0 else x.shape[:-1] + (k // 16, 16))
  fn = _fake_quantize_fn(axis, blocks.ndim, out_dtype, callback_launch.launcher())
  return fn(blocks)[0].reshape(x.shape)
