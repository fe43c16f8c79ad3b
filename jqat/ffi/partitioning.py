"""Partitioning rules of jqat's custom calls: sharded inputs run the kernels on the local shard.

jax-triton's custom call has no partitioning rule of its own, so without this module
XLA gathers every operand to every device. Each op's per-shard function (the jax-triton
calls of one launch plan) is wrapped in ``jax.experimental.custom_partitioning`` with

- a Shardy ``sharding_rule`` (jax >= 0.7's default partitioner), built from the op's
  per-operand factor list (:class:`OpSpec`), and
- ``infer_sharding_from_operands`` for the GSPMD partitioner (``jax_use_shardy_partitioner``
  off);
- one ``partition`` callback shared by both, which decides the final shardings
  (:func:`assign`) and runs the per-shard function on local shapes.

The rule of every op is elementwise in its leading axes: attention is independent per
batch row and per KV-head group, rope_qdq per row. The fake-quantize and delta kernels
of the attention plans are launched inside those ops, so the op-level rule covers them;
qat_matmul's two quantize passes are ops of their own, elementwise in every axis but the
16 elements of an NVFP4 block (:func:`fake_quantize_spec`).

Factors (one letter per axis, as in an einsum):
  b batch; t query sequence; s key sequence; n query heads; k KV heads; d head dim;
  r (r1, r2, ...) rows and h heads of rope_qdq; w its channels; p, c its cache;
  q blocks of 16 and e the 16 elements of a block of a quantize pass; r (r1, ...) the rows of its x, c the
  columns of its w.
Query heads are sharded exactly like KV heads (the partition step enforces it; the Shardy
rule keeps ``n`` and ``k`` as separate factors, because a compound ``(k g)`` lets Shardy
split one mesh axis over both, which no NamedSharding describes). A device holding KV
heads ``[i*K/P, (i+1)*K/P)`` then holds query heads ``[i*N/P, (i+1)*N/P)``, and query head
``n`` reads KV head ``n // (N/K)``, which for those heads is the same block. When K is not
divisible by the head sharding (MQA, say), heads are gathered instead (correct, not
collective-free). Sequence sharding raises: a query shard needs every key it may see and
its global offset for the causal mask, which is what :func:`jqat.parallel.ulysses_attention` provides.
"""

from __future__ import annotations

import dataclasses
import math

from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

SEQUENCE = frozenset("ts")  # never sharded here: jqat.parallel.ulysses_attention
QUERY_HEADS, KV_HEADS = "n", "k"


@dataclasses.dataclass(frozen=True)
class OpSpec:
  """The axes of one op: ``(name, factors)`` per operand and per result, in call order.

  replicated: factors every device needs whole (the head dim, rope channels, the cache).
  An extra operand that leads with B (a mask, say) is one more ``("lengths", ("b",))``.
  """

  op: str
  operands: tuple[tuple[str, tuple[str, ...]], ...]
  results: tuple[tuple[str, tuple[str, ...]], ...]
  replicated: frozenset = frozenset()

  def rule(self) -> str:
    """The Shardy rule, e.g. ``"b t n d, b s k d, b s k d -> b t n d, b t n d, b n t"``."""
    term = lambda factors: " ".join(factors)
    return ", ".join(term(f) for _, f in self.operands) + " -> " + ", ".join(term(f) for _, f in self.results)


# The mask operands in jqat.ffi.options.MASK_OPERANDS order: lengths [B], segment ids [B, T] / [B, S].
_MASK_AXES = (("query_seq_lengths", "b"), ("key_value_seq_lengths", "b"), ("q_segment_ids", "bt"),
              ("kv_segment_ids", "bs"))


def _masks(present) -> tuple:
  return tuple(axes for axes, p in zip(_MASK_AXES, present) if p)


_QKV_AXES = {"q": "btnd", "k": "bskd", "v": "bskd"}


def attention_forward_spec(present=(), row_max: bool = False, kept=(), residuals: bool = True) -> OpSpec:
  """q, k, v and the present mask operands -> O, O', lse (and row_max with p_scale="row"), then fq(X) for each
  name X of ``kept`` (the plan's ``keep_quantized`` outputs); O alone without ``residuals``."""
  outs = (("out", "btnd"),)
  if residuals:
    outs += (("out_high_precision", "btnd"), ("lse", "bnt")) + (("row_max", "bnt"),) * row_max
  return OpSpec("attention forward",
                (("query", "btnd"), ("key", "bskd"), ("value", "bskd")) + _masks(present),
                outs + tuple((f"fq_{name}", _QKV_AXES[name]) for name in kept),
                frozenset("d"))


def attention_backward_spec(present=(), row_max: bool = False) -> OpSpec:
  """dO, q, k, v, O', lse (and row_max with p_scale="row") and the present mask operands -> dq, dk, dv."""
  return OpSpec("attention backward",
                (("d_out", "btnd"), ("query", "btnd"), ("key", "bskd"), ("value", "bskd"),
                 ("out_for_delta", "btnd"), ("lse", "bnt")) + (("row_max", "bnt"),) * row_max + _masks(present),
                (("d_query", "btnd"), ("d_key", "bskd"), ("d_value", "bskd")),
                frozenset("d"))


def rope_qdq_spec(x_rank: int, positions_rank: int) -> OpSpec:
  """x [r, (h,) w] or [r, r1, ..., w], positions over x's leading ``positions_rank`` axes, cache [p, c]."""
  rows = ("r",) + tuple(f"r{i}" for i in range(1, x_rank - 1))
  x = rows[:positions_rank] + ("h",) * (x_rank - 1 - positions_rank) + ("w",)
  return OpSpec("rope_qdq", (("x", x), ("cache", ("p", "c")), ("positions", rows[:positions_rank])), (("out", x),),
                frozenset("wpc"))


def decode_spec(paged: bool) -> OpSpec:
  """q, the four cache tensors (codes c, scales e), kv_lengths (and page_table) -> O. A paged cache's pool (pages
  p, rows z) and its table (x) are needed whole by every device; batch and heads shard as in attention."""
  cache = ("pzkc", "pzke") if paged else ("bskc", "bske")
  operands = (("query", "btnd"), ("k_codes", cache[0]), ("k_scales", cache[1]), ("v_codes", cache[0]),
              ("v_scales", cache[1]), ("kv_lengths", "b")) + ((("page_table", "bx"),) if paged else ())
  return OpSpec("decode_attention", operands, (("out", "btnd"),), frozenset("dcepzx" if paged else "dce"))


def kv_cache_update_spec(paged: bool) -> OpSpec:
  """k_new, v_new, positions, the four cache tensors (and page_table) -> the four cache tensors."""
  cache = ("pzkc", "pzke") if paged else ("bskc", "bske")
  tensors = (("k_codes", cache[0]), ("k_scales", cache[1]), ("v_codes", cache[0]), ("v_scales", cache[1]))
  operands = (("k_new", "btkd"), ("v_new", "btkd"), ("positions", "bt")) + tensors + (
      (("page_table", "bx"),) if paged else ())
  return OpSpec("kv_cache_update", operands, tensors, frozenset("dcepzx" if paged else "dce"))


def fake_quantize_spec(rank: int, axis: int) -> OpSpec:
  """A quantize pass of qat_matmul on its operand split into NVFP4 blocks: ``axis=-1``: x ``[r, r1, ..., q, e]``
  (``[..., K]`` as ``[..., K // 16, 16]``, ``rank`` axes); ``axis=0``: w ``[q, e, c]`` (``[K, N]`` as
  ``[K // 16, 16, N]``). Only ``e`` is gathered: a shard of whole blocks quantizes like the whole tensor, so rows,
  columns and the blocks along K (a K-sharded, row-parallel linear) stay local."""
  if axis == 0:
    factors = ("q", "e", "c")
  else:
    factors = ("r",) * (rank > 2) + tuple(f"r{i}" for i in range(1, rank - 2)) + ("q", "e")
  assert len(factors) == rank, (rank, axis)
  return OpSpec("nvfp4 quantize pass", (("x", factors),), (("fq_x", factors),), frozenset("e"))


def _axes(entry) -> tuple[str, ...]:
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _spec_of(sharding, ndim: int, name: str, op: str) -> tuple[tuple[str, ...], ...]:
  if not isinstance(sharding, NamedSharding):
    raise TypeError(f"jqat {op}: {name} must be sharded with a jax.sharding.NamedSharding over a Mesh, got "
                    f"{type(sharding).__name__} (inside a jax.shard_map that leaves mesh axes automatic, make it "
                    f"manual over every axis: axis_names=set(mesh.axis_names))")
  spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
  return tuple(_axes(e) for e in spec)


def assign(spec: OpSpec, mesh, arg_shapes, *, check_sequence: bool = True) -> dict:
  """Mesh axes per factor (a tuple, empty for replicated) from the operands' shardings.

  Batch-like factors keep the first operand's sharding that divides them; heads take the
  first sharding of query or KV heads that divides both N and K; replicated factors are
  gathered; a sharded sequence raises ValueError naming jqat.parallel.ulysses_attention
  (with ``check_sequence``; else it is kept, for the partition step to raise).
  """
  sizes, seen = {}, {}
  for (name, factors), shape in zip(spec.operands, arg_shapes):
    for f, dim, axes in zip(factors, shape.shape, _spec_of(shape.sharding, len(shape.shape), name, spec.op)):
      sizes.setdefault(f, dim)
      if axes:
        if f in SEQUENCE and check_sequence:
          raise ValueError(
              f"jqat {spec.op}: {name} is sharded along its sequence axis (mesh axes {axes}); the kernels need "
              f"every key of a query's rows. Shard batch or heads, or for sequence parallelism call "
              f"jqat.parallel.ulysses_attention inside jax.shard_map (or jqat.parallel.attention(..., seq_axis=)).")
        seen.setdefault(f, []).append(axes)
  width = lambda axes: math.prod(mesh.shape[a] for a in axes)
  out, used = {}, set()

  def take(f, candidates, dims):
    for axes in candidates:
      if not used.intersection(axes) and all(d % width(axes) == 0 for d in dims):
        used.update(axes)
        out[f] = axes
        return
    out[f] = ()

  for f, size in sizes.items():
    if f in out:
      continue
    if f in (QUERY_HEADS, KV_HEADS):
      heads = seen.get(QUERY_HEADS, []) + seen.get(KV_HEADS, [])
      take(KV_HEADS, heads, [sizes[h] for h in (QUERY_HEADS, KV_HEADS) if h in sizes])
      out[QUERY_HEADS] = out[KV_HEADS]
    else:
      take(f, [] if f in spec.replicated else seen.get(f, []), [] if f in SEQUENCE else [size])
  return out


def shardings(spec: OpSpec, mesh, factors_axes: dict, which: str) -> tuple:
  entries = spec.operands if which == "operands" else spec.results
  return tuple(NamedSharding(mesh, P(*(factors_axes[f] or None for f in factors))) for _, factors in entries)


def partitioned(fun, spec: OpSpec):
  """``fun(*arrays) -> tuple of arrays`` (the per-shard function) with the partitioning rule of ``spec``.

  On one device, and inside a fully manual ``jax.shard_map``, JAX lowers ``fun`` itself.
  """
  wrapped = custom_partitioning(fun)

  def partition(mesh, arg_shapes, result_shape):
    del result_shape
    axes = assign(spec, mesh, arg_shapes)
    return mesh, fun, shardings(spec, mesh, axes, "results"), shardings(spec, mesh, axes, "operands")

  def infer(mesh, arg_shapes, result_shape):
    # GSPMD aborts the process on an exception here: a sharded sequence raises in partition.
    del result_shape
    return shardings(spec, mesh, assign(spec, mesh, arg_shapes, check_sequence=False), "results")

  # Shardy wants the special factors in the order they first appear in the rule.
  order = [f for _, factors in spec.operands + spec.results for f in factors]
  replicated = tuple(sorted(spec.replicated, key=order.index))
  wrapped.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=spec.rule(),
                        need_replication_factors=replicated)
  return wrapped


def collectives(hlo_text: str) -> dict:
  """Counts of each collective op in compiled HLO text (``jax.jit(f).lower(...).compile().as_text()``)."""
  names = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
  counts = dict.fromkeys(names, 0)
  for line in hlo_text.splitlines():
    for n in names:
      # "all-gather-start" / "all-reduce-start" are the async forms of one collective.
      if f" {n}(" in line or f" {n}-start(" in line:
        counts[n] += 1
  return counts
