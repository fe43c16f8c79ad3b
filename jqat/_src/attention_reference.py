"""Pure-JAX NVFP4 QAT attention (SPEC section 3): the ``"xla"`` implementation and the kernels' oracle.

Layout BTNH: query [B, Tq, N, D], key/value [B, Tk, K, D], N % K == 0.
The forward walks KV tiles of ``block_n`` keys exactly as the kernel does,
because the quantized probabilities depend on the running max at each tile.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ffi.options import QATConfig
from jqat import nvfp4

_HI = lax.Precision.HIGHEST


def _bf16(x):
  # Round FP32 to the nearest BF16 value, kept in FP32. Not a convert pair: under jit,
  # XLA's excess-precision rule may drop f32->bf16->f32 converts; reduce_precision stays.
  return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


def _inputs(q, k, v, cfg):
  """FP32 copies of Q, K, V (fake-quantized when enabled), Q grouped as [B, K, G, Tq, D]."""
  fq = (lambda t: nvfp4.fake_quantize(t, axis=-1)) if cfg.quantize_qkv else (lambda t: t)
  b, tq, n, d = q.shape
  kh = k.shape[2]
  qh = fq(q).astype(jnp.float32).reshape(b, tq, kh, n // kh, d).transpose(0, 2, 3, 1, 4)
  kt = fq(k).astype(jnp.float32).transpose(0, 2, 1, 3)  # [B, K, Tk, D]
  vt = fq(v).astype(jnp.float32).transpose(0, 2, 1, 3)
  return qh, kt, vt


NO_MASKS = (None, None, None, None)  # query_seq_lengths, key_value_seq_lengths, q_segment_ids, kv_segment_ids


def visible(tq, tk, key_idx, masks=NO_MASKS, *, is_causal=False, local_window_size=None,
            causal_alignment="top_left"):
  """[B or 1, Tq, len(key_idx)] bool: keys ``key_idx`` (int32, -1 for a padded slot) each query row may see.

  masks: ``(q_len [B], kv_len [B], q_seg [B, Tq], kv_seg [B, Tk])`` int32, each optional (None).
  Key j is visible to query i iff j is a real key (0 <= j < Tk), i < q_len[b], j < kv_len[b],
  q_seg[b, i] == kv_seg[b, j], j <= i + offset when causal, and
  i + offset - left <= j <= i + offset + right with a window ``(left, right)``;
  offset = 0 ("top_left") or Tk - Tq ("bottom_right").
  """
  q_len, kv_len, q_seg, kv_seg = masks
  rows = jnp.arange(tq)[None, :, None]
  keys = key_idx[None, None, :]
  diag = rows + (tk - tq if causal_alignment == "bottom_right" else 0)
  ok = keys >= 0
  if is_causal:
    ok = ok & (keys <= diag)
  if local_window_size is not None:
    left, right = local_window_size
    ok = ok & (keys >= diag - left) & (keys <= diag + right)
  if q_len is not None:
    ok = ok & (rows < q_len[:, None, None])
  if kv_len is not None:
    ok = ok & (keys < kv_len[:, None, None])
  if q_seg is not None:
    seg_k = jnp.take(kv_seg, jnp.maximum(key_idx, 0), axis=1)  # padded slots are already hidden by keys >= 0
    ok = ok & (q_seg[:, :, None] == seg_k[:, None, :])
  return jnp.broadcast_to(ok, (ok.shape[0], tq, key_idx.shape[0]))


def forward(q, k, v, *, scale, is_causal, block_n, cfg: QATConfig, masks=NO_MASKS, local_window_size=None,
            causal_alignment="top_left"):
  """Returns ``O [B,Tq,N,D]``, ``O' [B,Tq,N,D]`` (query dtype) and ``lse [B,N,Tq]`` FP32.

  masks, local_window_size, causal_alignment: as in :func:`visible`.
  """
  b, tq, n, d = q.shape
  tk = k.shape[1]
  qh, kt, vt = _inputs(q, k, v, cfg)
  n_tiles = -(-tk // block_n)
  pad = n_tiles * block_n - tk
  kt = jnp.pad(kt, ((0, 0), (0, 0), (0, pad), (0, 0)))
  vt = jnp.pad(vt, ((0, 0), (0, 0), (0, pad), (0, 0)))
  tiles_k = kt.reshape(b, kt.shape[1], n_tiles, block_n, d).transpose(2, 0, 1, 3, 4)
  tiles_v = vt.reshape(b, vt.shape[1], n_tiles, block_n, d).transpose(2, 0, 1, 3, 4)
  starts = jnp.arange(n_tiles) * block_n

  def step(carry, tile):
    m, l, acc, acc_hp = carry
    kb, vb, start = tile
    key_idx = start + jnp.arange(block_n)
    valid = visible(tq, tk, jnp.where(key_idx < tk, key_idx, -1), masks, is_causal=is_causal,
                    local_window_size=local_window_size, causal_alignment=causal_alignment)[:, None, None]
    s = scale * jnp.einsum("bkgqd,bknd->bkgqn", qh, kb, precision=_HI)
    s = jnp.where(valid, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows with nothing visible yet
    p_tilde = jnp.where(valid, jnp.exp(s - m_safe[..., None]), 0.0)
    p_out = nvfp4.fake_quantize(p_tilde, axis=-1, mask=valid) if cfg.quantize_p else _bf16(p_tilde)
    alpha = jnp.exp(m - m_safe)
    l = alpha * l + jnp.sum(p_tilde, axis=-1)
    acc = alpha[..., None] * acc + jnp.einsum("bkgqn,bknd->bkgqd", p_out, vb, precision=_HI)
    acc_hp = alpha[..., None] * acc_hp + jnp.einsum("bkgqn,bknd->bkgqd", _bf16(p_tilde), vb, precision=_HI)
    return (m_new, l, acc, acc_hp), None

  stats = qh.shape[:-1]
  init = (jnp.full(stats, -jnp.inf, jnp.float32), jnp.zeros(stats, jnp.float32),
          jnp.zeros(qh.shape, jnp.float32), jnp.zeros(qh.shape, jnp.float32))
  (m, l, acc, acc_hp), _ = lax.scan(step, init, (tiles_k, tiles_v, starts))
  empty = l == 0.0  # no visible key: O = O' = 0, lse = -inf
  inv = jnp.where(empty, 0.0, 1.0 / jnp.where(empty, 1.0, l))[..., None]
  lse = jnp.where(empty, -jnp.inf, m + jnp.log(jnp.where(empty, 1.0, l)))

  def to_btnh(x):
    # Rounded explicitly: under jit a consumer of O' (the backward's delta) could
    # otherwise read the FP32 value through an elided convert.
    fi = jnp.finfo(q.dtype)
    x = lax.reduce_precision(x, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)
    return x.transpose(0, 3, 1, 2, 4).reshape(b, tq, n, d).astype(q.dtype)

  return to_btnh(acc * inv), to_btnh(acc_hp * inv), lse.reshape(b, n, tq)


def backward(do, q, k, v, o_for_delta, lse, *, scale, is_causal, cfg: QATConfig, masks=NO_MASKS,
             local_window_size=None, causal_alignment="top_left"):
  """Gradients of SPEC section 3 given ``dO, Q, K, V``, the output used for delta and ``lse``.

  o_for_delta: O' (Attn-QAT) or O (the ``high_precision_delta=False`` ablation).
  masks, local_window_size, causal_alignment: as in :func:`visible` (those of the forward).
  Returns dQ, dK, dV in the dtypes of q, k, v.
  """
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  g = n // kh
  qh, kt, vt = _inputs(q, k, v, cfg)
  grp = lambda x: x.astype(jnp.float32).reshape(b, tq, kh, g, -1).transpose(0, 2, 3, 1, 4)
  do_g, o_g = grp(do), grp(o_for_delta)
  lse_g = lse.reshape(b, kh, g, tq)
  valid = visible(tq, tk, jnp.arange(tk), masks, is_causal=is_causal, local_window_size=local_window_size,
                  causal_alignment=causal_alignment)[:, None, None]
  s = scale * jnp.einsum("bkgqd,bknd->bkgqn", qh, kt, precision=_HI)
  lse_safe = jnp.where(lse_g == -jnp.inf, 0.0, lse_g)[..., None]
  p = jnp.where(valid & (lse_g[..., None] > -jnp.inf), jnp.exp(s - lse_safe), 0.0)
  delta = jnp.sum(o_g * do_g, axis=-1, keepdims=True)
  dp = jnp.einsum("bkgqd,bknd->bkgqn", do_g, vt, precision=_HI)
  ds = _bf16(p * (dp - delta))
  dq = scale * jnp.einsum("bkgqn,bknd->bkgqd", ds, kt, precision=_HI)
  dk = scale * jnp.einsum("bkgqn,bkgqd->bknd", ds, qh, precision=_HI)
  p_dv = nvfp4.fake_quantize(p, axis=-1, mask=valid) if cfg.quantize_p_backward else _bf16(p)
  dv = jnp.einsum("bkgqn,bkgqd->bknd", p_dv, do_g, precision=_HI)
  dq = dq.transpose(0, 3, 1, 2, 4).reshape(b, tq, n, d)
  return dq.astype(q.dtype), dk.transpose(0, 2, 1, 3).astype(k.dtype), dv.transpose(0, 2, 1, 3).astype(v.dtype)
