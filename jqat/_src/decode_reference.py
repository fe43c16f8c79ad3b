"""Pure-JAX decode attention over a packed NVFP4 KV cache and the cache write: the ``"xla"`` implementation.

The numerics are docs/NUMERICS.md's "Decode": the training forward's O on the dequantized cache, the KV walk
cut into ``num_splits`` runs of tiles that start from an empty state and are merged by their maxima. Shapes:
query [B, Tq, N, D]; a cache tensor ``(codes [.., D // 2] uint8, scales [.., D // 16] float8_e4m3fn)`` with
leading axes [B, T, K] (contiguous) or [num_pages, page_size, K] and ``page_table [B, pages_per_seq]``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jqat._src import attention_reference as reference
from jqat._src import nvfp4
from jqat.ffi.options import P_ROW_RANGE, DecodeOptions


def gather(codes, scales, page_table=None):
  """A cache tensor as FP32 values ``[B, capacity, K, D]``: contiguous as it is, paged through the table.

  Page ids outside ``[0, num_pages)`` are clamped into it (the kernels read those rows too)."""
  if page_table is not None:
    b, pages = page_table.shape
    ids = jnp.clip(page_table, 0, codes.shape[0] - 1)
    codes = codes[ids].reshape((b, pages * codes.shape[1]) + codes.shape[2:])
    scales = scales[ids].reshape((b, pages * scales.shape[1]) + scales.shape[2:])
  return nvfp4.dequantize(codes, scales, axis=-1, dtype=jnp.float32)


def _merge(state, into):
  """``into`` with the run ``state`` (m, l, acc) folded in by their maxima; an empty run (m = -inf) adds 0."""
  m, l, acc = state
  big_m, big_l, big_acc = into
  new = jnp.maximum(m, big_m)
  safe = jnp.where(new == -jnp.inf, 0.0, new)
  w = jnp.where(m == -jnp.inf, 0.0, jnp.exp(m - safe))
  big_w = jnp.where(big_m == -jnp.inf, 0.0, jnp.exp(big_m - safe))
  return new, big_w * big_l + w * l, big_w[..., None] * big_acc + w[..., None] * acc


def decode(q, k, v, kv_len, opts: DecodeOptions):
  """O ``[B, Tq, N, D]`` in q's dtype from FP32 cache values ``k, v [B, T, K, D]`` (:func:`gather`) and
  ``kv_len [B]`` int32 (clamped to ``[0, T]``)."""
  b, tq, n, d = q.shape
  t_cap, kh = k.shape[1], k.shape[2]
  g = n // kh
  block = opts.block_n
  cfg = opts.config
  row = opts.p_scale == "row" and cfg.quantize_p
  qh = reference._fq(q) if cfg.quantize_qkv else q
  qh = qh.astype(jnp.float32).reshape(b, tq, kh, g, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, Tq, D]
  kt, vt = (x.transpose(0, 2, 1, 3) for x in (k, v))  # [B, K, T, D]
  kv_len = jnp.clip(kv_len.astype(jnp.int32), 0, t_cap)
  limit = jnp.broadcast_to(kv_len[:, None], (b, tq))  # keys below it are visible to query i
  if opts.is_causal:
    limit = jnp.minimum(limit, kv_len[:, None] - tq + jnp.arange(tq)[None, :] + 1)
  tiles = -(-kv_len // block)
  chunk = jnp.maximum(-(-tiles // opts.num_splits), 1)  # tiles per run

  def step(carry, tile):
    run, total = carry
    kb, vb, index = tile
    starts = (index % chunk == 0)[:, None, None, None]  # [B, 1, 1, 1]: this tile begins a run
    merged = _merge(run, total)
    total = tuple(jnp.where(starts[..., None] if x.ndim == 5 else starts, y, x) for x, y in zip(total, merged))
    empty = (jnp.full_like(run[0], -jnp.inf), jnp.zeros_like(run[1]), jnp.zeros_like(run[2]))
    m, l, acc = (jnp.where(starts[..., None] if x.ndim == 5 else starts, e, x) for x, e in zip(run, empty))
    keys = index * block + jnp.arange(block)
    valid = keys[None, None, None, None, :] < limit[:, None, None, :, None]  # [B, 1, 1, Tq, block]
    s = opts.scale * jnp.einsum("bkgqd,bknd->bkgqn", qh, kb, precision=reference._HI)
    s = jnp.where(valid, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.where(valid, jnp.exp(s - m_safe[..., None]), 0.0)
    if row:
      p = P_ROW_RANGE * p
    p_op = reference._fq(p, mask=valid) if cfg.quantize_p else reference._bf16(p)
    alpha = jnp.exp(m - m_safe)
    l = alpha * l + jnp.sum(p, axis=-1)
    acc = alpha[..., None] * acc + reference._dot("bkgqn,bknd->bkgqd", p_op, vb, valid)
    return ((m_new, l, acc), total), None

  stats = qh.shape[:-1]
  empty = lambda: (reference._fill(-jnp.inf, stats, q, k, v, kv_len), reference._fill(0.0, stats, q, k, v, kv_len),
                   reference._fill(0.0, qh.shape, q, k, v, kv_len))
  n_tiles = -(-t_cap // block)
  xs = (reference._tiles(kt, block), reference._tiles(vt, block), jnp.arange(n_tiles))
  (run, total), _ = lax.scan(step, (empty(), empty()), xs)
  _, l, acc = _merge(run, total)
  none = l == 0.0
  out = jnp.where(none[..., None], 0.0, acc / jnp.where(none, 1.0, l)[..., None])
  fi = jnp.finfo(q.dtype)
  out = lax.reduce_precision(out, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, tq, n, d).astype(q.dtype)


def write(codes, scales, x, positions, page_table=None):
  """``(codes, scales)`` with ``jqat.nvfp4.quantize(x)`` stored at ``positions``: x [B, Tn, K, D], positions
  [B, Tn] int32. A position outside ``[0, capacity)`` or a page id outside ``[0, num_pages)`` drops that row's
  write. Under ``jit`` with the caches donated, XLA updates them in place."""
  new_codes, new_scales = nvfp4.quantize(x, axis=-1)
  b, tn = positions.shape
  if page_table is None:
    cap = codes.shape[1]
    ok = (positions >= 0) & (positions < cap)
    rows = jnp.where(ok, jnp.arange(b)[:, None] * cap + positions, codes.shape[0] * cap)
  else:
    size = codes.shape[1]
    cap = page_table.shape[1] * size
    ok = (positions >= 0) & (positions < cap)
    page = jnp.take_along_axis(page_table, jnp.clip(positions, 0, cap - 1) // size, axis=1)
    ok = ok & (page >= 0) & (page < codes.shape[0])
    rows = jnp.where(ok, page * size + positions % size, codes.shape[0] * size)
  flat = lambda a: a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])
  rows = rows.reshape(-1)  # out of range for a dropped write
  codes = flat(codes).at[rows].set(flat(new_codes), mode="drop").reshape(codes.shape)
  scales = flat(scales).at[rows].set(flat(new_scales), mode="drop").reshape(scales.shape)
  return codes, scales
