"""Pure-JAX NVFP4 QAT attention (docs/NUMERICS.md, sections 4-5): the ``"xla"`` implementation and the kernels' oracle.

Layout BTNH: query [B, Tq, N, D], key/value [B, Tk, K, D], N % K == 0.
The forward walks KV tiles of ``block_n`` keys exactly as the kernel does,
because the quantized probabilities depend on the running max at each tile.
The backward walks KV tiles too (of ``block_k`` keys), so both directions
hold O(Tq * tile) intermediates instead of [B, N, Tq, Tk] arrays.

NaN is never hidden: a NaN in any input reaches every output that depends on
it, and no other. Masked (query, key) pairs contribute exactly nothing, not
``0 * NaN``; only ``lse == -inf`` means "this row sees no key".
Zero-size B, Tq, Tk or N give empty results (Tk = 0: O = O' = 0, lse = -inf).

``p_scale`` picks how fq(P) is scaled (docs/NUMERICS.md, section 7.1): "block" is sections 4-5;
"row" quantizes ``R * exp(S - m)`` (R = ``P_ROW_RANGE`` = 6 * 448) and folds 1/R into the
normalization, in the forward with the running max, in the backward with the forward's final
row max ``row_max`` (an extra forward output and backward input, row mode only).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from jqat._src import nvfp4
from jqat.ffi.options import P_ROW_RANGE, QATConfig

_HI = lax.Precision.HIGHEST
BACKWARD_BLOCK_K = 128  # keys per backward tile: bounds its [B, K, G, Tq, block] intermediates


def _bf16(x):
  # Round FP32 to the nearest BF16 value, kept in FP32. Not a convert pair: under jit,
  # XLA's excess-precision rule may drop f32->bf16->f32 converts; reduce_precision stays.
  return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


def _fq(x, axis=-1, mask=None):
  # A zero-size array has no block to quantize (and nvfp4's blocking reshape cannot infer
  # a dimension of an empty array).
  return x if x.size == 0 else nvfp4.fake_quantize(x, axis=axis, mask=mask)


def _fill(value, shape, *like):
  """FP32 constant of ``shape`` typed as varying over every manual mesh axis ``like`` varies over.

  Inside ``shard_map`` a scan carry must have one type at input and output; the body's
  output varies with the inputs, so a constant initial carry (device-invariant) is rejected.
  ``zeros_like`` gives its result the varying axes of its argument (no version-specific
  ``pvary``/``pcast`` call needed), and adding zero keeps the fill value (even -inf) while
  taking the union of the axes.
  """
  out = jnp.full(shape, value, jnp.float32)
  for x in like:
    out = out + jnp.zeros_like(x, jnp.float32, shape=())
  return out


def _significand(x):
  """(M, E) with ``x == M * 2**E`` and M in [2**23, 2**24), for FP32 ``x > 0`` finite (subnormals normalized)."""
  bits = lax.bitcast_convert_type(x, jnp.int32)
  field, frac = bits >> 23, bits & 0x7FFFFF
  m = jnp.where(field > 0, frac | 0x800000, frac)
  e = jnp.where(field > 0, field - 150, -149)
  shift = lax.clz(m) - 8  # 0 when normal; a subnormal's leading bit moved up to bit 23 (m > 0 as x > 0)
  return m << shift, e - shift


def div_rn(num, den):
  """``num / den`` in FP32, correctly rounded (IEEE round-to-nearest-even, subnormal results and overflow to
  inf included), for ``num > 0`` finite and ``den > 0`` (``den == inf`` gives 0).

  XLA's GPU division is not correctly rounded: ``2688 / amax`` came out one ulp off on the H200 (against the CPU
  backend's, in one process), which moved fq(enc * x) codes. This one divides the integer significands bit by
  bit (exact int32 arithmetic, the same on every backend): Q = floor(Mn * 2**26 / Md) and its remainder, then
  rounds Q to the result's precision."""
  mn, en = _significand(num)
  md, ed = _significand(den)
  q = (mn >= md).astype(jnp.int32)  # Mn / Md is in (1/2, 2): the quotient's first bit
  r = mn - q * md
  for _ in range(26):  # r < Md < 2**24 stays within int32 when doubled
    r = r << 1
    bit = (r >= md).astype(jnp.int32)
    r, q = r - bit * md, (q << 1) | bit
  top = jnp.where(q >= 1 << 26, 26, 25)  # q in [2**25, 2**27): its leading bit
  exp = en - ed - 26 + top  # the result is in [2**exp, 2**(exp + 1))
  biased = exp + 127
  # Bits below the result's last place: 24 significant bits when normal, fewer when subnormal.
  drop = jnp.minimum(top - 23 + jnp.maximum(1 - biased, 0), 28)
  kept = q >> drop
  rest = q - (kept << drop)
  half = 1 << (drop - 1)
  up = (rest > half) | ((rest == half) & ((r != 0) | ((kept & 1) == 1)))
  kept = kept + up.astype(jnp.int32)
  # Normal: the exponent field plus the fraction (a carry out of the significand bumps the exponent);
  # subnormal: the significand is the bit pattern (a carry to 2**23 is the smallest normal).
  bits = jnp.where(biased >= 1, (jnp.clip(biased, 1, 255) << 23) + kept - (1 << 23), kept)
  out = lax.bitcast_convert_type(jnp.minimum(bits, 0x7F800000), jnp.float32)  # overflow: inf
  return jnp.where(jnp.isinf(den), 0.0, out)


def tensor_scale(x, length=None):
  """The FP32 encode scale of ``qkv_scale="tensor"`` per (batch, head): ``[B, 1, H, 1]``.

  x: [B, T, H, D]; length: int32 [B] or None. amax = max |x| over the (batch, head)'s first ``length[b]``
  rows (all T without lengths), all D channels; ``enc = 2688 / amax`` (IEEE FP32 division, :func:`div_rn`), or 1
  when amax is 0 or not finite (a zero slab; an infinite or NaN one, whose blocks then saturate or turn NaN exactly
  as under "block").
  """
  ax = jnp.abs(x.astype(jnp.float32))
  ax = jnp.where(jnp.isnan(ax), jnp.inf, ax)  # XLA's max may drop a NaN: count it as non-finite explicitly
  if length is not None:
    ax = jnp.where(jnp.arange(x.shape[1])[None, :, None, None] < length[:, None, None, None], ax, 0.0)
  amax = jnp.max(ax, axis=(1, 3), keepdims=True, initial=0.0)
  ok = jnp.isfinite(amax) & (amax > 0)
  return jnp.where(ok, div_rn(jnp.float32(P_ROW_RANGE), jnp.where(ok, amax, 1.0)), 1.0)


def fq_tensor(x, length=None):
  """Two-level NVFP4 of ``x`` [B, T, H, D] (docs/NUMERICS.md): ``(fq(enc * x), 1 / enc)`` in FP32, with
  ``enc = tensor_scale(x, length)`` and fq's blocks of 16 along D; ``fq(enc * x) * (1 / enc)`` is the
  dequantized value. ``enc * x`` is one FP32 product, ``1 / enc`` one correctly rounded division (:func:`div_rn`)."""
  enc = tensor_scale(x, length)
  return _fq(enc * x.astype(jnp.float32)), div_rn(jnp.float32(1.0), enc)


def _inputs(q, k, v, cfg, qkv_scale, masks):
  """FP32 copies of Q, K, V (fake-quantized when enabled), Q grouped as [B, K, G, Tq, D].

  qkv_scale "tensor": amax over the live query rows (``masks[0]``) and keys (``masks[1]``)."""
  b, tq, n, d = q.shape
  kh = k.shape[2]

  def fq(t, length):
    if not cfg.quantize_qkv:
      return t
    if qkv_scale == "tensor":  # dequantized: fq(enc * x) times its (batch, head)'s 1 / enc
      y, dec = fq_tensor(t, length)
      return y * dec
    return _fq(t)
  qh = fq(q, masks[0]).astype(jnp.float32).reshape(b, tq, kh, n // kh, d).transpose(0, 2, 3, 1, 4)
  kt = fq(k, masks[1]).astype(jnp.float32).transpose(0, 2, 1, 3)  # [B, K, Tk, D]
  vt = fq(v, masks[1]).astype(jnp.float32).transpose(0, 2, 1, 3)
  return qh, kt, vt


def _tiles(x, block):
  """[B, K, Tk, D] -> [n_tiles, B, K, block, D], keys padded with zeros to a whole tile."""
  b, kh, tk, d = x.shape
  n_tiles = -(-tk // block)
  x = jnp.pad(x, ((0, 0), (0, 0), (0, n_tiles * block - tk), (0, 0)))
  return x.reshape(b, kh, n_tiles, block, d).transpose(2, 0, 1, 3, 4)


def _untile(y, tk):
  """Inverse of :func:`_tiles` for per-key results: [n_tiles, B, K, block, D] -> [B, Tk, K, D]."""
  n_tiles, b, kh, block, d = y.shape
  return y.transpose(1, 0, 3, 2, 4).reshape(b, n_tiles * block, kh, d)[:, :tk]


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


def _tile_visible(tq, tk, start, block, masks, static):
  """[B or 1, 1, 1, Tq, block] keys ``start + arange(block)`` of one tile each query row sees (padding hidden)."""
  key_idx = start + jnp.arange(block)
  return visible(tq, tk, jnp.where(key_idx < tk, key_idx, -1), masks, **static)[:, None, None]


def _masked(masks, static) -> bool:
  """Whether real (query, key) pairs are hidden, so products over keys need the NaN guard of :func:`_dot`."""
  return static["is_causal"] or static["local_window_size"] is not None or any(x is not None for x in masks)


def _dot(spec, a, b, visible):
  """``einsum(spec, a, b)`` contracting a (query, key) axis along which ``a`` is exactly 0 where masked.

  IEEE gives ``0 * NaN = NaN``, so a NaN in ``b`` at a masked pair would reach outputs that
  do not depend on it. With ``visible`` ([Tq, block], broadcastable to ``a``), NaN in ``b``
  counts only through visible pairs. None means no real pair is masked (padding keys are
  zeros in every operand): the plain product is then already exact.
  """
  if visible is None:
    return jnp.einsum(spec, a, b, precision=_HI)
  nan = jnp.isnan(b)
  out = jnp.einsum(spec, a, jnp.where(nan, 0.0, b), precision=_HI)
  # 0/1 operands: exact at any matmul precision.
  hits = jnp.einsum(spec, jnp.broadcast_to(visible, a.shape).astype(jnp.float32), nan.astype(jnp.float32))
  return jnp.where(hits > 0, jnp.nan, out)


def forward(q, k, v, *, scale, is_causal, block_n, cfg: QATConfig, masks=NO_MASKS, local_window_size=None,
            causal_alignment="top_left", p_scale="block", qkv_scale="block"):
  """Returns ``O [B,Tq,N,D]``, ``O' [B,Tq,N,D]`` (query dtype) and ``lse [B,N,Tq]`` FP32; with
  ``p_scale == "row"`` also ``row_max [B,N,Tq]`` FP32, the final row max m of the scaled scores
  (natural units, -inf for a row that sees no key), which the row-mode backward needs.

  masks, local_window_size, causal_alignment: as in :func:`visible`.
  qkv_scale: "block" or "tensor" (:func:`fq_tensor` for Q, K, V; amax over live rows and keys).
  Intermediates are O(Tq * block_n) per (batch, head): one KV tile at a time.
  """
  static = dict(is_causal=is_causal, local_window_size=local_window_size, causal_alignment=causal_alignment)
  present = [x for x in masks if x is not None]
  b, tq, n, d = q.shape
  tk = k.shape[1]
  row = p_scale == "row"
  if n == 0:  # no heads (N = K = 0): empty results; there is no group size N // K to form
    out = (jnp.zeros(q.shape, q.dtype), jnp.zeros(q.shape, q.dtype), jnp.zeros((b, 0, tq), jnp.float32))
    return out + (jnp.zeros((b, 0, tq), jnp.float32),) if row else out
  qh, kt, vt = _inputs(q, k, v, cfg, qkv_scale, masks)

  def step(carry, tile):
    m, l, acc, acc_hp = carry
    kb, vb, start = tile
    valid = _tile_visible(tq, tk, start, block_n, masks, static)
    s = scale * jnp.einsum("bkgqd,bknd->bkgqn", qh, kb, precision=_HI)
    s = jnp.where(valid, s, -jnp.inf)
    # NaN in a visible score poisons the row's max, explicitly: XLA's CPU max reduction may return the other operand
    # of a NaN (x86 max semantics) once fused into the scan, which left row_max at -inf under a NaN lse.
    tile_max = jnp.where(jnp.any(jnp.isnan(s), axis=-1), jnp.nan, jnp.max(s, axis=-1))
    m_new = jnp.where(jnp.isnan(m), m, jnp.maximum(m, tile_max))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows with nothing visible yet
    # The row max's p is exactly 1 (every s at or above the running max gives 1): XLA computes s again in the
    # fusion of the exponent and may contract ``scale * (q . k) - m`` into an FMA there, whose exact residual
    # (about an ulp of s) made the max's p anything but 1 at huge logits (rows of zeros, lse of +-inf at scale >= 1e8).
    # The compare reads s itself, rounded as the max was.
    p_tilde = jnp.where(valid, jnp.where(s >= m_safe[..., None], 1.0, jnp.exp(s - m_safe[..., None])), 0.0)
    if row and cfg.quantize_p:
      # Two-level: the tile is R * p_tilde (one FP32 product; the kernel folds log2(R) into its exp2), and
      # l, O' and the fq(P) operand all take it, so 1 / l is 1 / (R * sum p_tilde) for O and O' alike.
      p_tilde = P_ROW_RANGE * p_tilde
    p_out = _fq(p_tilde, mask=valid) if cfg.quantize_p else _bf16(p_tilde)
    alpha = jnp.exp(m - m_safe)
    l = alpha * l + jnp.sum(p_tilde, axis=-1)
    guard = valid if _masked(masks, static) else None
    acc = alpha[..., None] * acc + _dot("bkgqn,bknd->bkgqd", p_out, vb, guard)
    acc_hp = alpha[..., None] * acc_hp + _dot("bkgqn,bknd->bkgqd", _bf16(p_tilde), vb, guard)
    return (m_new, l, acc, acc_hp), None

  stats = qh.shape[:-1]
  init = (_fill(-jnp.inf, stats, q, k, v, *present), _fill(0.0, stats, q, k, v, *present),
          _fill(0.0, qh.shape, q, k, v, *present), _fill(0.0, qh.shape, q, k, v, *present))
  starts = jnp.arange(-(-tk // block_n)) * block_n
  (m, l, acc, acc_hp), _ = lax.scan(step, init, (_tiles(kt, block_n), _tiles(vt, block_n), starts))
  empty = l == 0.0  # no visible key: O = O' = 0, lse = -inf (a NaN l is not empty)
  inv = jnp.where(empty, 0.0, 1.0 / jnp.where(empty, 1.0, l))[..., None]
  log_l = jnp.log(jnp.where(empty, 1.0, l))
  if row and cfg.quantize_p:  # l sums R * p_tilde
    log_l = log_l - math.log(P_ROW_RANGE)
  lse = jnp.where(empty, -jnp.inf, m + log_l)

  def to_btnh(x):
    # Rounded explicitly: under jit a consumer of O' (the backward's delta) could
    # otherwise read the FP32 value through an elided convert.
    fi = jnp.finfo(q.dtype)
    x = lax.reduce_precision(x, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)
    return x.transpose(0, 3, 1, 2, 4).reshape(b, tq, n, d).astype(q.dtype)

  out = (to_btnh(acc * inv), to_btnh(acc_hp * inv), lse.reshape(b, n, tq))
  return out + (m.reshape(b, n, tq),) if row else out


def backward(do, q, k, v, o_for_delta, lse, *, scale, is_causal, cfg: QATConfig, masks=NO_MASKS,
             local_window_size=None, causal_alignment="top_left", block_k=BACKWARD_BLOCK_K, p_scale="block",
             row_max=None, qkv_scale="block"):
  """Gradients of docs/NUMERICS.md, section 5, given ``dO, Q, K, V``, the output used for delta and ``lse``.

  do, o_for_delta: [B, Tq, N, D]; q: [B, Tq, N, D]; k, v: [B, Tk, K, D]; lse: [B, N, Tq] fp32.
  o_for_delta: O' (Attn-QAT) or O (the ``high_precision_delta=False`` ablation).
  masks, local_window_size, causal_alignment: as in :func:`visible` (those of the forward).
  row_max: [B, N, Tq] fp32, the forward's ``row_max``; needed (only) with ``p_scale == "row"``, where
    the dV operand is ``bf16(fq(R * exp(S - m)) * (1 / (R * exp(lse - m))))`` instead of ``fq(P)``.
  qkv_scale: the forward's (Q, K, V quantized as there; gradients straight-through).
  block_k: keys per tile (a multiple of 16), so fq(P)'s blocks of 16 keys stay at absolute
    key indices. dK and dV of a key come from its own tile alone, so they do not depend on
    block_k; dQ is accumulated tile by tile in FP32, so block_k changes its summation order
    (reordering noise only).
  Returns dQ, dK, dV in the dtypes of q, k, v.
  """
  if block_k <= 0 or block_k % 16:
    raise ValueError(f"block_k must be a positive multiple of 16, got {block_k}")
  static = dict(is_causal=is_causal, local_window_size=local_window_size, causal_alignment=causal_alignment)
  present = [x for x in masks if x is not None]
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  if n == 0:  # no heads (N = K = 0): empty gradients
    return jnp.zeros(q.shape, q.dtype), jnp.zeros(k.shape, k.dtype), jnp.zeros(v.shape, v.dtype)
  g = n // kh
  qh, kt, vt = _inputs(q, k, v, cfg, qkv_scale, masks)
  grp = lambda x: x.astype(jnp.float32).reshape(b, tq, kh, g, d).transpose(0, 2, 3, 1, 4)
  do_g = grp(do)
  delta = jnp.sum(grp(o_for_delta) * do_g, axis=-1, keepdims=True)
  lse_g = lse.reshape(b, kh, g, tq)[..., None]
  sees = lse_g != -jnp.inf  # only -inf means "sees no key"; a NaN lse must reach P
  lse_safe = jnp.where(sees, lse_g, 0.0)
  block = min(block_k, max(16, -(-tk // 16) * 16))  # no tile wider than the padded keys
  row = p_scale == "row" and cfg.quantize_p_backward
  if row:
    if row_max is None:
      raise ValueError("p_scale='row' needs row_max, the forward's fourth output")
    m_safe = jnp.where(sees, row_max.reshape(b, kh, g, tq)[..., None], 0.0)
    # 1 / (R l) with l = exp(lse - m) the forward's row sum: dV's operand is (R p_tilde)'s fq over R l, ~P.
    inv_rl = jnp.where(sees, 1.0 / (P_ROW_RANGE * jnp.exp(lse_safe - m_safe)), 0.0)

  def step(dq, tile):
    kb, vb, start = tile
    valid = _tile_visible(tq, tk, start, block, masks, static)
    guard = valid if _masked(masks, static) else None
    s = scale * jnp.einsum("bkgqd,bknd->bkgqn", qh, kb, precision=_HI)
    # P <= 1 (lse >= every s of its row): exactly 1 where s reaches lse (a row with one key, or huge logits), for the
    # reason of the forward's exponent (an FMA contraction there gave exp(rounding error of s)).
    p = jnp.where(valid & sees, jnp.where(s >= lse_safe, 1.0, jnp.exp(s - lse_safe)), 0.0)
    dp = jnp.einsum("bkgqd,bknd->bkgqn", do_g, vb, precision=_HI)
    ds = _bf16(jnp.where(valid, p * (dp - delta), 0.0))
    dq = dq + _dot("bkgqn,bknd->bkgqd", ds, kb, guard)
    dk = scale * _dot("bkgqn,bkgqd->bknd", ds, qh, guard)
    if row:
      p_tilde = jnp.where(valid & sees, jnp.where(s >= m_safe, 1.0, jnp.exp(s - m_safe)), 0.0)
      # Masked pairs exactly 0 after the row factor too: a row with a NaN lse has a NaN 1 / (R l).
      p_dv = _bf16(jnp.where(valid, _fq(P_ROW_RANGE * p_tilde, mask=valid) * inv_rl, 0.0))
    else:
      p_dv = _fq(p, mask=valid) if cfg.quantize_p_backward else _bf16(p)
    dv = _dot("bkgqn,bkgqd->bknd", p_dv, do_g, guard)
    return dq, (dk, dv)

  starts = jnp.arange(-(-tk // block)) * block
  dq, (dk, dv) = lax.scan(step, _fill(0.0, qh.shape, do, q, k, v, o_for_delta, lse, *present),
                          (_tiles(kt, block), _tiles(vt, block), starts))
  dq = (scale * dq).transpose(0, 3, 1, 2, 4).reshape(b, tq, n, d)
  return dq.astype(q.dtype), _untile(dk, tk).astype(k.dtype), _untile(dv, tk).astype(v.dtype)
