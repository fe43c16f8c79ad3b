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
