"""Multi-device QAT attention: Ulysses sequence parallelism and a mesh-level entry point.

Shapes as in :func:`jqat.attention`: query [B, T, N, D], key/value [B, S, K, D]; P is the
size of the sequence mesh axis. Batch and head sharding need nothing from this module:
``jqat.attention`` under ``jax.jit`` with ``NamedSharding`` inputs runs on the local
shard (``jqat.ffi.partitioning``). Sequence sharding does: a query shard needs every key it
may see, so :func:`ulysses_attention` re-shards sequence -> heads with one all-to-all
per tensor, runs local attention on whole sequences, and re-shards back (DeepSpeed-
Ulysses). Each device then computes exactly what the unsharded call computes for its
heads.
"""

from __future__ import annotations

import math

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from jqat._src import validate
from jqat._src.attention import attention as _attention

try:
  _shard_map = jax.shard_map
  _NO_CHECK = {"check_vma": False}
except AttributeError:  # jax < 0.7
  from jax.experimental.shard_map import shard_map as _shard_map
  _NO_CHECK = {"check_rep": False}


_MESH_TYPES = tuple(t for t in (getattr(jax.sharding, "Mesh", None), getattr(jax.sharding, "AbstractMesh", None)) if t)


def ulysses_attention(query, key, value, *, axis_name, **kwargs):
  """``jqat.attention`` on a sequence sharded over ``axis_name``, inside ``jax.shard_map``.

  query: [B, T/P, N, D] local shard of the sequence; key, value: [B, S/P, K, D]
  (shards in device order along ``axis_name``). N and K must be divisible by P (GQA:
  a device takes query heads [i*N/P, (i+1)*N/P) and the KV heads they read).
  kwargs: the keywords of :func:`jqat.attention` (``is_causal``, ``scale``, ``implementation``, masks, ...).
    Masks: ``q_segment_ids`` [B, T/P] and ``kv_segment_ids`` [B, S/P] are local shards like the
    tensors (all-gathered here: int32, T/P values per row); ``query_seq_lengths`` and
    ``key_value_seq_lengths`` [B] are the global lengths, the same on every device;
    ``local_window_size`` and ``causal_alignment`` refer to global positions.
  Returns out: [B, T/P, N, D], the local sequence shard. Differentiable: the backward runs
  the mirror all-to-alls; nothing is gathered. Bitwise what the unsharded call gives for
  the same rows, since each device attends over whole sequences of its heads.
  """
  validate.attention_inputs(query, key, value)
  size = lax.axis_size(axis_name)
  for name, heads in (("query", query.shape[2]), ("key", key.shape[2])):
    if heads % size:
      raise ValueError(f"ulysses_attention: {name} heads ({heads}) must be divisible by the size of axis "
                       f"{axis_name!r} ({size}); with fewer KV heads, repeat them to a multiple of {size} first")
  for name, x, length in (("q_segment_ids", kwargs.get("q_segment_ids"), query.shape[1]),
                          ("kv_segment_ids", kwargs.get("kv_segment_ids"), key.shape[1])):
    if x is None:
      continue
    if getattr(x, "ndim", None) != 2 or x.shape[1] != length:
      raise ValueError(f"ulysses_attention: {name} must be the local shard [B, {length}] of the sequence's segment "
                       f"ids, like the tensors; got shape {getattr(x, 'shape', type(x).__name__)}")
    # Each device attends over whole sequences: it needs every position's segment id.
    kwargs[name] = lax.all_gather(x, axis_name, axis=1, tiled=True)
  # [B, T/P, heads, D] <-> [B, T, heads/P, D]: chunk i of the heads goes to device i.
  to_heads = lambda x: lax.all_to_all(x, axis_name, split_axis=2, concat_axis=1, tiled=True)
  out = _attention(to_heads(query), to_heads(key), to_heads(value), **kwargs)
  return lax.all_to_all(out, axis_name, split_axis=1, concat_axis=2, tiled=True)


def _names(axis) -> tuple[str, ...]:
  if axis is None:
    return ()
  return tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)


def attention(query, key, value, *, mesh, batch_axis=None, head_axis=None, seq_axis=None, **kwargs):
  """``jqat.attention`` over ``mesh``: batch, heads and sequence sharded over the named mesh axes.

  query: [B, T, N, D]; key, value: [B, S, K, D] (global arrays; their placement is
  decided here). batch_axis / head_axis / seq_axis: a mesh axis name, a tuple of names
  or None (replicated along that dimension). With ``seq_axis`` the call is
  :func:`ulysses_attention` per (batch, head) shard; without it, local attention.
  kwargs: the keywords of :func:`jqat.attention`, masks included (global arrays: segment ids are
    sharded as ``P(batch_axis, seq_axis)``, lengths as ``P(batch_axis)``).
  Returns out: [B, T, N, D] sharded as ``P(batch_axis, seq_axis, head_axis)``. Mesh axes
  not named hold replicas of the computation (and their gradients are all-reduced).
  """
  validate.attention_inputs(query, key, value)
  if not isinstance(mesh, _MESH_TYPES):
    raise TypeError(f"mesh must be a jax.sharding.Mesh (the devices and the axis names to shard over), got "
                    f"{type(mesh).__name__}")
  named = {"batch_axis": _names(batch_axis), "head_axis": _names(head_axis), "seq_axis": _names(seq_axis)}
  used = [a for axes in named.values() for a in axes]
  for arg, axes in named.items():
    for a in axes:
      if a not in mesh.shape:
        raise ValueError(f"{arg} must name axes of mesh {tuple(mesh.axis_names)}, got {a!r}")
  if len(set(used)) != len(used):
    raise ValueError(f"batch_axis, head_axis and seq_axis must use distinct mesh axes, got {named}")
  width = lambda axes: math.prod(mesh.shape[a] for a in axes)
  b, t, n, _ = query.shape
  s, kh = key.shape[1], key.shape[2]
  checks = (("batch_axis", "B", b, width(named["batch_axis"])),
            ("head_axis", "N", n, width(named["head_axis"])), ("head_axis", "K", kh, width(named["head_axis"])),
            ("seq_axis", "T", t, width(named["seq_axis"])), ("seq_axis", "S", s, width(named["seq_axis"])))
  for arg, dim, value_, parts in checks:
    if value_ % parts:
      raise ValueError(f"{arg} {named[arg]} splits {dim}={value_} into {parts} parts; {dim} must be divisible by "
                       f"{parts}")
  spec = P(batch_axis, seq_axis, head_axis)

  # Mask arrays travel as shard_map operands, sharded like the rows they describe.
  mask_specs = {"query_seq_lengths": P(batch_axis), "key_value_seq_lengths": P(batch_axis),
                "q_segment_ids": P(batch_axis, seq_axis), "kv_segment_ids": P(batch_axis, seq_axis)}
  arrays = {name: kwargs.pop(name) for name in mask_specs if kwargs.get(name) is not None}
  validate.mask_operands(query, key, **arrays)  # global shapes, before anything is sharded
  for name, x in arrays.items():  # host values, before shard_map turns them into (wrapped) int32 operands
    if not isinstance(x, jax.core.Tracer) and validate.dtype_name(x) != "int32":
      validate.fits_int32(name, x)

  def local(q, k, v, masks):
    if seq_axis is None:
      return _attention(q, k, v, **masks, **kwargs)
    return ulysses_attention(q, k, v, axis_name=seq_axis, **masks, **kwargs)

  # Fully manual over every mesh axis: the custom calls see local shapes and need no
  # partitioning rule. Axes not named hold replicas, whose input gradients the backward
  # sums (an all-reduce): give a mesh of the axes in use.
  in_specs = (spec, spec, spec, {name: mask_specs[name] for name in arrays})
  fn = _shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=spec, **_NO_CHECK)
  return fn(query, key, value, arrays)
