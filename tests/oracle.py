"""Independent NumPy oracles, written from SPEC sections 2 and 3 without calling project code.

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


def attention_oracle(q, k, v, *, scale, is_causal, block_n, quantize_qkv=True, quantize_p=True, vis=None):
    """Float64 re-derivation of the SPEC section 3 forward: (O, O', lse) with O, O' float64.

    q: [B, Tq, N, D]; k, v: [B, Tk, K, D]; walks KV tiles of ``block_n`` keys.
    vis: [B, Tq, Tk] bool visibility (:func:`visible_oracle`); overrides ``is_causal``.
    """
    q, k, v = (np.asarray(t, np.float32) for t in (q, k, v))
    if quantize_qkv:
        q, k, v = (fq_oracle(t) for t in (q, k, v))
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    b, tq, n, d = q.shape
    tk, kh = k.shape[1], k.shape[2]
    k = np.repeat(k, n // kh, axis=2)
    v = np.repeat(v, n // kh, axis=2)
    s_all = scale * np.einsum("bqnd,bknd->bnqk", q, k)
    vis = _visible(b, tq, tk, is_causal, vis)
    m = np.full((b, n, tq), -np.inf)
    l = np.zeros((b, n, tq))
    acc = np.zeros((b, n, tq, d))
    acc_hp = np.zeros((b, n, tq, d))
    with np.errstate(invalid="ignore"):
        for start in range(0, tk, block_n):
            sl = slice(start, min(start + block_n, tk))
            valid = vis[..., sl]
            s = np.where(valid, s_all[..., sl], -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))
            m_safe = np.where(np.isinf(m_new), 0.0, m_new)
            pt = np.where(valid, np.exp(s - m_safe[..., None]), 0.0)
            pf = _fq64(pt, mask=np.broadcast_to(valid, pt.shape)) if quantize_p else _bf16_round(pt)
            alpha = np.where(np.isinf(m), 0.0, np.exp(m - m_safe))
            l = alpha * l + pt.sum(-1)
            acc = alpha[..., None] * acc + np.einsum("bnqk,bknd->bnqd", pf, v[:, sl])
            acc_hp = alpha[..., None] * acc_hp + np.einsum("bnqk,bknd->bnqd", _bf16_round(pt), v[:, sl])
            m = m_new
    empty = l == 0
    inv = np.where(empty, 0.0, 1.0 / np.where(empty, 1.0, l))[..., None]
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, l)))
    to_btnh = lambda x: (x * inv).transpose(0, 2, 1, 3)
    return to_btnh(acc), to_btnh(acc_hp), lse


def attention_grad_oracle(do, q, k, v, o_for_delta, lse, *, scale, is_causal, quantize_qkv=True,
                          quantize_p_backward=True, vis=None):
    """Float64 re-derivation of the SPEC section 3 backward with materialized P: (dQ, dK, dV) float64.

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
        p = np.where(vis & np.isfinite(lse)[..., None], np.exp(s - np.where(np.isfinite(lse), lse, 0)[..., None]), 0.0)
    delta = np.einsum("bqnd,bqnd->bnq", o, do)[..., None]
    dp = np.einsum("bqnd,bknd->bnqk", do, vr)
    ds = _bf16_round(p * (dp - delta))
    dq = scale * np.einsum("bnqk,bknd->bqnd", ds, kr)
    dk = scale * np.einsum("bnqk,bqnd->bknd", ds, q)
    pq = _fq64(p, mask=np.broadcast_to(vis, p.shape)) if quantize_p_backward else _bf16_round(p)
    dv = np.einsum("bnqk,bqnd->bknd", pq, do)
    fold = lambda x: x.reshape(b, tk, kh, g, d).sum(axis=3)
    return dq, fold(dk), fold(dv)
