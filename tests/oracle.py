"""Independent NumPy oracles, written from docs/NUMERICS.md, sections 2-5, without calling project code.

The quantizer oracle divides with NumPy's IEEE FP32 division (correctly
rounded) and rounds by nearest-value search over explicit value tables, so it
shares no method with the division-free implementation it checks.
"""

import numpy as np

# All non-negative finite E4M3 (fn) values: exponent bias 7, 3 mantissa bits, max 448.
E4M3_VALUES = np.array(
    [m / 8 * 2.0**-6 for m in range(8)]
    + [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8) if not (e == 15 and m == 7)]
)
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def round_to_table(v, table):
    """Round non-negative float64 ``v`` to the nearest entry of ``table`` (sorted), ties to the even index.

    The index parity is the mantissa LSB for both E4M3 and E2M1 tables; values past
    the end saturate to the last entry.
    """
    v = np.asarray(v, np.float64)
    hi = np.clip(np.searchsorted(table, v, side="left"), 1, len(table) - 1)
    lo = hi - 1
    dlo = v - table[lo]
    dhi = table[hi] - v
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    out = np.where(pick_hi, table[hi], table[lo])
    return np.where(v >= table[-1], table[-1], out)


def fq_oracle(x, axis=-1, mask=None):
    """NVFP4 fake quantization of ``x`` (any float dtype, cast to FP32) in blocks of 16 along ``axis``."""
    x = np.asarray(x, np.float32)
    valid = np.ones(x.shape, bool) if mask is None else np.broadcast_to(mask, x.shape)
    x = np.moveaxis(x, axis, -1)
    valid = np.moveaxis(valid, axis, -1)
    n = x.shape[-1]
    out = np.zeros(x.shape, np.float32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for start in range(0, n, 16):
            xb = x[..., start : start + 16]
            vb = valid[..., start : start + 16]
            amax = np.max(np.where(vb, np.abs(xb), np.float32(0)), axis=-1, keepdims=True)
            nan = np.any(vb & np.isnan(xb), axis=-1, keepdims=True)
            amax = np.where(nan, np.float32(0), amax).astype(np.float32)
            t = np.maximum(amax / np.float32(6), np.float32(2.0**-9)).astype(np.float32)  # IEEE RN
            s = round_to_table(np.minimum(t.astype(np.float64), 1e30), E4M3_VALUES).astype(np.float32)
            y = (np.abs(xb) / s).astype(np.float32)  # IEEE RN FP32 division
            q = round_to_table(np.where(np.isnan(y), 0, y), E2M1_VALUES)
            val = np.copysign(q * s.astype(np.float64), xb.astype(np.float64)).astype(np.float32)
            val = np.where(nan, np.float32(np.nan), val)
            out[..., start : start + 16] = np.where(vb, val, np.float32(0))
    return np.moveaxis(out, -1, axis)


def bits(a):
    """The raw bit patterns of a float array, for bitwise comparison (NaN payloads normalized)."""
    a = np.asarray(a)
    if a.dtype == np.float32:
        u = a.view(np.uint32).copy()
        u[np.isnan(a)] = 0x7FC00000
        return u
    if a.dtype.itemsize == 2:
        u = a.view(np.uint16).copy()
        u[np.isnan(a.astype(np.float32))] = 0x7FC0
        return u
    raise TypeError(a.dtype)


def _bf16_round(x):
    """Round float64/float32 values to the nearest BF16 (ties to even), returned as float64."""
    import ml_dtypes

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _fq64(x, axis=-1, mask=None):
    """NVFP4 fake quantization of float64 ``x``: rounded to FP32 first (the kernels' working precision)."""
    return fq_oracle(np.asarray(x, np.float32), axis=axis, mask=mask).astype(np.float64)


def visible_oracle(b, tq, tk, *, is_causal=False, q_len=None, kv_len=None, q_seg=None, kv_seg=None, window=None,
                   bottom_right=False):
    """[B, Tq, Tk] bool, element by element from the rule: key j is visible to query i of batch b iff
    i < q_len[b], j < kv_len[b], q_seg[b, i] == kv_seg[b, j], j - i <= shift when causal and
    -left <= j - i - shift <= right with a window (left, right); shift = Tk - Tq when bottom_right, else 0."""
    shift = tk - tq if bottom_right else 0
    out = np.zeros((b, tq, tk), bool)
    for bi in range(b):
        for i in range(tq):
            for j in range(tk):
                rel = j - i - shift  # how far right of the diagonal key j sits
                ok = not (is_causal and rel > 0)
                ok &= window is None or -window[0] <= rel <= window[1]
                ok &= q_len is None or i < int(q_len[bi])
                ok &= kv_len is None or j < int(kv_len[bi])
                ok &= q_seg is None or int(q_seg[bi][i]) == int(kv_seg[bi][j])
                out[bi, i, j] = ok
    return out


def _visible(b, tq, tk, is_causal, vis):
    """[B, 1, Tq, Tk]: ``vis`` [B, Tq, Tk] when given, else the (top-left) causal or the full mask."""
    if vis is None:
        vis = visible_oracle(b, tq, tk, is_causal=is_causal)
    return np.asarray(vis, bool)[:, None]


def _forward_walk(s_all, v, vis, *, block_n, quantize_p=True, p_range=1.0):
    """The forward's walk over KV tiles of ``block_n`` keys (docs/NUMERICS.md, section 4), float64.

    s_all: [B, N, Tq, Tk] scaled scores; v: [B, Tk, N, D] (KV heads repeated); vis: [B, 1, Tq, Tk] bool.
    p_range: the factor fq(P) and O' see the tile at (1, or R_ROW for p_scale="row"); O and O' divide by
    ``p_range * l``. Returns (O, O' [B, Tq, N, D], lse, m, l [B, N, Tq]).
    """
    b, n, tq, tk = s_all.shape
    d = v.shape[-1]
    m = np.full((b, n, tq), -np.inf)
    l = np.zeros((b, n, tq))
    acc = np.zeros((b, n, tq, d))
    acc_hp = np.zeros((b, n, tq, d))
    with np.errstate(invalid="ignore"):
        for start in range(0, tk, block_n):
            sl = slice(start, min(start + block_n, tk))
            valid = np.broadcast_to(vis[..., sl], s_all[..., sl].shape)
            s = np.where(valid, s_all[..., sl], -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))
            m_safe = np.where(np.isinf(m_new), 0.0, m_new)
            pt = np.where(valid, np.exp(s - m_safe[..., None]), 0.0)
            pf = _fq64(p_range * pt, mask=valid) if quantize_p else _bf16_round(p_range * pt)
            alpha = np.where(np.isinf(m), 0.0, np.exp(m - m_safe))
            l = alpha * l + pt.sum(-1)
            acc = alpha[..., None] * acc + np.einsum("bnqk,bknd->bnqd", pf, v[:, sl])
            acc_hp = alpha[..., None] * acc_hp + np.einsum("bnqk,bknd->bnqd", _bf16_round(p_range * pt), v[:, sl])
            m = m_new
    empty = l == 0
    safe_l = np.where(empty, 1.0, l)
    out = lambda a: np.where(empty[..., None], 0.0, a / (p_range * safe_l)[..., None]).transpose(0, 2, 1, 3)
    lse = np.where(empty, -np.inf, m + np.log(safe_l))
    return out(acc), out(acc_hp), lse, m, l


def _repeat_kv(k, v, n):
    """K and V [B, Tk, K, D] with each KV head repeated for its ``n // K`` query heads."""
    g = n // k.shape[2]
    return np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)


def attention_oracle(q, k, v, *, scale, is_causal, block_n, quantize_qkv=True, quantize_p=True, vis=None):
    """Float64 re-derivation of the forward of docs/NUMERICS.md, section 4: (O, O', lse) with O, O' float64.

    q: [B, Tq, N, D]; k, v: [B, Tk, K, D]; walks KV tiles of ``block_n`` keys.
    vis: [B, Tq, Tk] bool visibility (:func:`visible_oracle`); overrides ``is_causal``.
    """
    q, k, v = (np.asarray(t, np.float32) for t in (q, k, v))
    if quantize_qkv:
        q, k, v = (fq_oracle(t) for t in (q, k, v))
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    b, tq, n, d = q.shape
    k, v = _repeat_kv(k, v, n)
    s_all = scale * np.einsum("bqnd,bknd->bnqk", q, k)
    vis = _visible(b, tq, k.shape[1], is_causal, vis)
    return _forward_walk(s_all, v, vis, block_n=block_n, quantize_p=quantize_p)[:3]


def attention_grad_oracle(do, q, k, v, o_for_delta, lse, *, scale, is_causal, quantize_qkv=True,
                          quantize_p_backward=True, vis=None):
    """Float64 re-derivation of the backward of docs/NUMERICS.md, section 5, with materialized P: (dQ, dK, dV) float64.

    vis: [B, Tq, Tk] bool visibility (:func:`visible_oracle`); overrides ``is_causal``.
    """
    q, k, v = (np.asarray(t, np.float32) for t in (q, k, v))
    if quantize_qkv:
        q, k, v = (fq_oracle(t) for t in (q, k, v))
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    do = np.asarray(do, np.float32).astype(np.float64)
    o = np.asarray(o_for_delta, np.float32).astype(np.float64)
    lse = np.asarray(lse, np.float64)
    b, tq, n, d = q.shape
    tk, kh = k.shape[1], k.shape[2]
    g = n // kh
    kr = np.repeat(k, g, axis=2)
    vr = np.repeat(v, g, axis=2)
    vis = _visible(b, tq, tk, is_causal, vis)
    s = scale * np.einsum("bqnd,bknd->bnqk", q, kr)
    with np.errstate(invalid="ignore"):
        # Only lse = -inf means "the row sees no key"; a NaN lse must reach P.
        sees = (lse != -np.inf)[..., None]
        p = np.where(vis & sees, np.exp(s - np.where(sees, lse[..., None], 0)), 0.0)
    delta = np.einsum("bqnd,bqnd->bnq", o, do)[..., None]
    dp = np.einsum("bqnd,bknd->bnqk", do, vr)
    ds = _bf16_round(p * (dp - delta))
    dq = scale * np.einsum("bnqk,bknd->bqnd", ds, kr)
    dk = scale * np.einsum("bnqk,bqnd->bknd", ds, q)
    pq = _fq64(p, mask=np.broadcast_to(vis, p.shape)) if quantize_p_backward else _bf16_round(p)
    dv = np.einsum("bnqk,bqnd->bknd", pq, do)
    fold = lambda x: x.reshape(b, tk, kh, g, d).sum(axis=3)
    return dq, fold(dk), fold(dv)


# NaN positions, derived from the dependency structure of docs/NUMERICS.md, sections 4-5, with booleans only
# (no arithmetic): an output is NaN iff some term of its formula over visible (query, key)
# pairs is NaN (IEEE: NaN * 0 is NaN). Masked pairs contribute no term at all.


def _nan_blocks(x, axis=-1, mask=None):
    """fq's NaN rule on a bool array: a NaN among a block's valid elements makes its valid elements NaN."""
    x = np.moveaxis(np.asarray(x, bool), axis, -1)
    valid = np.ones(x.shape, bool) if mask is None else np.moveaxis(np.broadcast_to(mask, x.shape), axis, -1)
    n = x.shape[-1]
    pad = [(0, 0)] * (x.ndim - 1) + [(0, -n % 16)]
    xb, vb = np.pad(x & valid, pad), np.pad(valid, pad)
    blocks = xb.reshape(xb.shape[:-1] + (-1, 16)).any(-1, keepdims=True)
    out = np.broadcast_to(blocks, blocks.shape[:-1] + (16,)).reshape(xb.shape) & vb
    return np.moveaxis(out[..., :n], -1, axis)


def _hits(spec, a, b):
    """Boolean einsum: True where some product term pairs two Trues."""
    return np.einsum(spec, np.asarray(a, np.int64), np.asarray(b, np.int64)) > 0


def _nan_scores(q_nan, k_nan, is_causal, quantize_qkv, vis=None):
    """NaN masks of fq(Q), fq(K) [B, T, heads, D], K per query head, the visibility [B, Tq, Tk] (``vis``, else the
    causal or full mask) and the NaN mask of the scores [B, N, Tq, Tk] (visible pairs only)."""
    if quantize_qkv:
        q_nan, k_nan = _nan_blocks(q_nan), _nan_blocks(k_nan)
    b, tq, tk = q_nan.shape[0], q_nan.shape[1], k_nan.shape[1]
    g = q_nan.shape[2] // k_nan.shape[2]
    kr = np.repeat(k_nan, g, axis=2)
    vis = np.broadcast_to(visible_oracle(1, tq, tk, is_causal=is_causal) if vis is None else np.asarray(vis, bool),
                          (b, tq, tk))
    s = vis[:, None] & (q_nan.any(-1).transpose(0, 2, 1)[..., :, None] | kr.any(-1).transpose(0, 2, 1)[..., None, :])
    return q_nan, kr, vis, s


def attention_nan_oracle(q_nan, k_nan, v_nan, *, is_causal, quantize_qkv=True, vis=None):
    """Where the forward's O and O' ([B, Tq, N, D]) and lse ([B, N, Tq]) are NaN, given input NaN masks.

    A NaN score of a visible key poisons its row's running max, hence the whole row of O,
    O' and lse; a NaN in fq(V) reaches the channels it sits in, for every row that sees its key.
    vis: [B, Tq, Tk] bool visibility (:func:`visible_oracle`); overrides ``is_causal``.
    """
    _, _, vis, s = _nan_scores(q_nan, k_nan, is_causal, quantize_qkv, vis)
    v_nan = _nan_blocks(v_nan) if quantize_qkv else np.asarray(v_nan, bool)
    vr = np.repeat(v_nan, q_nan.shape[2] // v_nan.shape[2], axis=2)
    row = s.any(-1)  # [B, N, Tq]
    o = row.transpose(0, 2, 1)[..., None] | _hits("bqk,bknd->bqnd", vis, vr)
    return o, row


def attention_grad_nan_oracle(do_nan, q_nan, k_nan, v_nan, o_nan, lse_nan, *, is_causal, quantize_qkv=True,
                              quantize_p_backward=True, vis=None):
    """Where the backward's dQ [B, Tq, N, D], dK and dV [B, Tk, K, D] are NaN, given input NaN masks.

    o_nan: NaN mask of the output used for delta; lse_nan: [B, N, Tq]. vis: as in :func:`attention_nan_oracle`.
    """
    qh, kr, vis, s = _nan_scores(q_nan, k_nan, is_causal, quantize_qkv, vis)
    v_nan = _nan_blocks(v_nan) if quantize_qkv else np.asarray(v_nan, bool)
    b, tq, n, d = qh.shape
    tk, kh = v_nan.shape[1], v_nan.shape[2]
    vr = np.repeat(v_nan, n // kh, axis=2)
    rows = lambda x: x.any(-1).transpose(0, 2, 1)  # [B, T, N, D] -> [B, N, T]
    vis4 = vis[:, None]
    p = vis4 & (s | np.asarray(lse_nan, bool)[..., None])
    delta = rows(np.asarray(o_nan, bool) | do_nan)
    dp = rows(do_nan)[..., :, None] | rows(vr)[..., None, :]
    ds = vis4 & (p | dp | delta[..., None])
    dq = ds.any(-1).transpose(0, 2, 1)[..., None] | _hits("bqk,bknd->bqnd", vis, kr)
    dk = ds.any(-2).transpose(0, 2, 1)[..., None] | _hits("bqk,bqnd->bknd", vis, qh)
    pq = _nan_blocks(p, mask=np.broadcast_to(vis4, p.shape)) if quantize_p_backward else p
    dv = pq.any(-2).transpose(0, 2, 1)[..., None] | _hits("bqk,bqnd->bknd", vis, do_nan)
    fold = lambda x: np.broadcast_to(x, (b, tk, n, d)).reshape(b, tk, kh, n // kh, d).any(3)
    return np.broadcast_to(dq, (b, tq, n, d)), fold(dk), fold(dv)


def pack_oracle(x, axis=-1):
    """Packed NVFP4 of ``x`` (docs/NUMERICS.md, section 3), by the same table rounding as :func:`fq_oracle`.

    Returns ``codes`` uint8 (element 2i in the low nibble; bit 3 sign, bits 2..0 the index
    into ``E2M1_VALUES``), ``scales`` float8_e4m3fn (NaN for a block holding a NaN) and the
    bool per-block NaN flag. Codes of a NaN block are left to the implementation (set to 0 here).
    """
    import ml_dtypes

    x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
    blocks = x.reshape(x.shape[:-1] + (-1, 16))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        nan = np.isnan(blocks).any(-1)
        amax = np.where(nan, np.float32(0), np.abs(np.where(np.isnan(blocks), 0, blocks)).max(-1)).astype(np.float32)
        t = np.maximum(amax / np.float32(6), np.float32(2.0**-9)).astype(np.float32)
        s = round_to_table(np.minimum(t.astype(np.float64), 1e30), E4M3_VALUES).astype(np.float32)
        y = (np.abs(blocks) / s[..., None]).astype(np.float32)
        q = round_to_table(np.where(np.isnan(y), 0, y), E2M1_VALUES)
    nib = np.searchsorted(E2M1_VALUES, q).astype(np.uint8) | (np.signbit(blocks).astype(np.uint8) << 3)
    nib = np.where(nan[..., None], np.uint8(0), nib).reshape(x.shape)
    codes = nib[..., 0::2] | (nib[..., 1::2] << 4)
    scales = np.where(nan, np.float32(np.nan), s).astype(ml_dtypes.float8_e4m3fn)
    return np.moveaxis(codes, -1, axis), np.moveaxis(scales, -1, axis), np.moveaxis(nan, -1, axis)


def unpack_oracle(codes, scales):
    """Float64 values of a packed NVFP4 tensor (``pack_oracle``'s layout), from the bit patterns and the tables."""
    import ml_dtypes

    codes = np.asarray(codes, np.uint8)
    nib = np.stack([codes & 15, codes >> 4], axis=-1).reshape(codes.shape[:-1] + (-1,))
    mag = E2M1_VALUES[nib & 7]
    val = np.where(nib & 8, -mag, mag)
    s = np.asarray(scales).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return val * np.repeat(s, 16, axis=-1)


def decode_oracle(q, k, v, kv_len, *, scale, block_n, num_splits=1, is_causal=True, quantize_q=True, quantize_p=True):
    """Float64 decode attention (docs/NUMERICS.md, section 10): O [B, Tq, N, D] float64.

    q: [B, Tq, N, D]; k, v: the cache's values [B, T, K, D] (``unpack_oracle``); kv_len [B]. Query i of sequence b
    sees keys j < kv_len[b], and with ``is_causal`` only j <= kv_len[b] - Tq + i. The live tiles of ``block_n`` keys
    are cut into ``num_splits`` runs of ceil(tiles / num_splits); each run is a forward walk from an empty state
    (fq(P) relative to its own running max) and the runs merge by their maxima.
    """
    q = np.asarray(q, np.float32)
    if quantize_q:
        q = fq_oracle(q)
    q = q.astype(np.float64)
    b, tq, n, d = q.shape
    kh = k.shape[2]
    pad = ((0, 0), (0, -k.shape[1] % block_n), (0, 0), (0, 0))  # whole tiles; the padding is never visible
    k, v = np.pad(np.asarray(k, np.float64), pad), np.pad(np.asarray(v, np.float64), pad)
    out = np.zeros((b, tq, n, d))
    for bi in range(b):
        length = int(kv_len[bi])
        tiles = -(-length // block_n)
        chunk = max(-(-tiles // num_splits), 1)
        limit = np.full(tq, length) if not is_causal else np.minimum(length, length - tq + np.arange(tq) + 1)
        for h in range(n):
            kk, vv = k[bi, :, h // (n // kh)], v[bi, :, h // (n // kh)]
            s_all = scale * q[bi, :, h] @ kk.T  # [Tq, T]
            runs = []
            for start_tile in range(0, tiles, chunk):
                m = np.full(tq, -np.inf)
                l = np.zeros(tq)
                acc = np.zeros((tq, d))
                for t in range(start_tile, min(start_tile + chunk, tiles)):
                    sl = slice(t * block_n, (t + 1) * block_n)
                    keys = np.arange(t * block_n, (t + 1) * block_n)
                    valid = keys[None, :] < limit[:, None]
                    s = np.where(valid, s_all[:, sl], -np.inf)
                    m_new = np.maximum(m, s.max(-1))
                    m_safe = np.where(np.isinf(m_new), 0.0, m_new)
                    with np.errstate(invalid="ignore"):
                        p = np.where(valid, np.exp(s - m_safe[:, None]), 0.0)
                    pf = _fq64(p, mask=valid) if quantize_p else _bf16_round(p)
                    alpha = np.where(np.isinf(m), 0.0, np.exp(m - m_safe))
                    l = alpha * l + p.sum(-1)
                    acc = alpha[:, None] * acc + pf @ vv[sl]
                    m = m_new
                runs.append((m, l, acc))
            if not runs:
                continue
            big = np.max([r[0] for r in runs], axis=0)
            safe = np.where(np.isinf(big), 0.0, big)
            w = [np.where(np.isinf(r[0]), 0.0, np.exp(r[0] - safe)) for r in runs]
            total = sum(wi * r[1] for wi, r in zip(w, runs))
            acc = sum(wi[:, None] * r[2] for wi, r in zip(w, runs))
            out[bi, :, h] = np.where(total[:, None] == 0, 0.0, acc / np.where(total == 0, 1.0, total)[:, None])
    return out


R_ROW = 6.0 * 448.0  # p_scale="row": fq(P) sees R * exp(S - m), E2M1's max times E4M3's


def row_oracle(q, k, v, do, *, scale, block_n, vis):
    """Float64 p_scale="row" forward and backward: (O, O', lse, m, dQ, dK, dV). vis: [B, Tq, Tk] bool."""
    q, k, v = (_fq64(np.asarray(t, np.float32)) for t in (q, k, v))
    do = np.asarray(do, np.float32).astype(np.float64)
    b, tq, n, d = q.shape
    tk, kh = k.shape[1], k.shape[2]
    g = n // kh
    kr, vr = _repeat_kv(k, v, n)
    vis = np.asarray(vis, bool)[:, None]
    s_all = scale * np.einsum("bqnd,bknd->bnqk", q, kr)
    # Row mode's tile is R_ROW * pt: fq(P) and O' both take it, O and O' both divide by R_ROW * l.
    o, o_hp, lse, m, l = _forward_walk(s_all, vr, vis, block_n=block_n, p_range=R_ROW)
    # Backward, P materialized; O' (bf16-rounded as stored) for delta.
    empty = l == 0
    safe_l = np.where(empty, 1.0, l)
    valid = np.broadcast_to(vis, s_all.shape)
    pt = np.where(valid & ~empty[..., None], np.exp(s_all - np.where(empty, 0.0, m)[..., None]), 0.0)
    p = pt / safe_l[..., None]
    delta = np.einsum("bqnd,bqnd->bnq", _bf16_round(o_hp), do)[..., None]
    ds = _bf16_round(p * (np.einsum("bqnd,bknd->bnqk", do, vr) - delta))
    dq = scale * np.einsum("bnqk,bknd->bqnd", ds, kr)
    dk = scale * np.einsum("bnqk,bqnd->bknd", ds, q)
    p_dv = _bf16_round(_fq64(R_ROW * pt, mask=valid) / (R_ROW * safe_l)[..., None])
    dv = np.einsum("bnqk,bqnd->bknd", p_dv, do)
    fold = lambda x: x.reshape(b, tk, kh, g, d).sum(axis=3)
    return o, o_hp, lse, m, dq, fold(dk), fold(dv)


def fq_tensor_oracle(x, length=None):
    """NumPy two-level NVFP4 per (batch, head) of x [B, T, H, D]: (fq(enc * x), 1 / enc) in FP32."""
    x = np.asarray(x, np.float32)
    ax = np.abs(x)
    if length is not None:
        ax = np.where(np.arange(x.shape[1])[None, :, None, None] < np.asarray(length)[:, None, None, None], ax, 0)
    with np.errstate(invalid="ignore"):
        amax = ax.max(axis=(1, 3), keepdims=True, initial=0).astype(np.float32)
        ok = np.isfinite(amax) & (amax > 0)
        enc = np.where(ok, np.float32(2688) / np.where(ok, amax, np.float32(1)), np.float32(1)).astype(np.float32)
        y = fq_oracle((enc * x).astype(np.float32))
    return y, (np.float32(1) / enc).astype(np.float32)
