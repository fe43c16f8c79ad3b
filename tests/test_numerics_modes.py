"""p_scale="row" (docs/NUMERICS.md) against an independent float64 re-derivation, and the defect it fixes.

The oracle here is written from the definition with NumPy (the quantizer from ``oracle.fq_oracle``),
not by calling the reference: R = 6 * 448; the forward accumulates fq(R * exp(S - m_running)) @ V and
divides by R * l; the backward's dV operand is fq(R * exp(S - m)) / (R * l) with m, l the final row
max and row sum, and dS keeps the unquantized P.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import assert_close, assert_reordered_equal
from oracle import _bf16_round, _fq64, attention_grad_oracle, attention_oracle, bits, fq_oracle, visible_oracle

import jqat
import jqat.torch
from jqat._src import attention_reference as reference
from jqat.ffi.options import QATConfig
from jqat.flax import make_attention_fn

R = 6.0 * 448.0
# FP32 work against a float64 oracle: bf16 output rounding (2^-9 relative) plus fq(P) codes flipped
# where exp's last-bit differences move a value across an E2M1 boundary; the same bounds as the
# block-mode reference tests.
OUT_BOUND = 2e-2
GRAD_BOUND = 2e-2


def row_oracle(q, k, v, do, *, scale, block_n, vis):
  """Float64 row-mode forward and backward: (O, O', lse, m, dQ, dK, dV). vis: [B, Tq, Tk] bool."""
  q, k, v = (_fq64(np.asarray(t, np.float32)) for t in (q, k, v))
  do = np.asarray(do, np.float32).astype(np.float64)
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  g = n // kh
  kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
  vis = np.asarray(vis, bool)[:, None]
  s_all = scale * np.einsum("bqnd,bknd->bnqk", q, kr)
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
      alpha = np.where(np.isinf(m), 0.0, np.exp(m - m_safe))
      l = alpha * l + pt.sum(-1)
      # Row mode's tile is R * pt: fq(P) and O' both take it, O and O' both divide by R * l.
      acc = alpha[..., None] * acc + np.einsum("bnqk,bknd->bnqd", _fq64(R * pt, mask=valid), vr[:, sl])
      acc_hp = alpha[..., None] * acc_hp + np.einsum("bnqk,bknd->bnqd", _bf16_round(R * pt), vr[:, sl])
      m = m_new
  empty = l == 0
  safe_l = np.where(empty, 1.0, l)
  o = np.where(empty[..., None], 0.0, acc / (R * safe_l)[..., None]).transpose(0, 2, 1, 3)
  o_hp = np.where(empty[..., None], 0.0, acc_hp / (R * safe_l)[..., None]).transpose(0, 2, 1, 3)
  lse = np.where(empty, -np.inf, m + np.log(safe_l))
  # Backward, P materialized; O' (bf16-rounded as stored) for delta.
  valid = np.broadcast_to(vis, s_all.shape)
  m_safe = np.where(empty, 0.0, m)[..., None]
  pt = np.where(valid & ~empty[..., None], np.exp(s_all - m_safe), 0.0)
  p = pt / safe_l[..., None]
  delta = np.einsum("bqnd,bqnd->bnq", _bf16_round(o_hp), do)[..., None]
  ds = _bf16_round(p * (np.einsum("bqnd,bknd->bnqk", do, vr) - delta))
  dq = scale * np.einsum("bnqk,bknd->bqnd", ds, kr)
  dk = scale * np.einsum("bnqk,bqnd->bknd", ds, q)
  p_dv = _bf16_round(_fq64(R * pt, mask=valid) / (R * safe_l)[..., None])
  dv = np.einsum("bnqk,bqnd->bknd", p_dv, do)
  fold = lambda x: x.reshape(b, tk, kh, g, d).sum(axis=3)
  return o, o_hp, lse, m, dq, fold(dk), fold(dv)


def _inputs(b, tq, tk, n, kh, d, seed=0, spread=2.0):
  rng = np.random.default_rng(seed)
  q = rng.normal(0, spread, (b, tq, n, d)).astype(np.float32)
  k = rng.normal(0, 1, (b, tk, kh, d)).astype(np.float32)
  v = rng.normal(0, 1, (b, tk, kh, d)).astype(np.float32)
  do = rng.normal(0, 1, (b, tq, n, d)).astype(np.float32)
  return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, do))


MASK_CASES = {
    "full": {},
    "causal": dict(is_causal=True),
    "lengths": dict(query_seq_lengths=np.array([20, 37]), key_value_seq_lengths=np.array([45, 9])),
    "segments": dict(q_segment_ids=np.repeat([[0, 1, 2]], 2, 0).repeat([15, 15, 7], 1),
                     kv_segment_ids=np.repeat([[0, 1, 3]], 2, 0).repeat([20, 20, 9], 1)),
}


def _vis(case, b, tq, tk):
  kw = MASK_CASES[case]
  return visible_oracle(b, tq, tk, is_causal=kw.get("is_causal", False), q_len=kw.get("query_seq_lengths"),
                        kv_len=kw.get("key_value_seq_lengths"), q_seg=kw.get("q_segment_ids"),
                        kv_seg=kw.get("kv_segment_ids"))


def _f(x):
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


@pytest.mark.parametrize("case", list(MASK_CASES))
def test_row_mode_reference_matches_float64_oracle(case):
  b, tq, tk, n, kh, d, block_n = 2, 37, 49, 4, 2, 32, 16
  q, k, v, do = _inputs(b, tq, tk, n, kh, d)
  kw = {name: jnp.asarray(x, jnp.int32) if name != "is_causal" else x for name, x in MASK_CASES[case].items()}
  scale = d**-0.5
  o, o_hp, lse, m = jqat.attention_forward(q, k, v, block_n=block_n, implementation="xla", p_scale="row", **kw)
  dq, dk, dv = jqat.attention_backward(do, q, k, v, o_hp, lse, implementation="xla", p_scale="row", row_max=m, **kw)
  want = row_oracle(q, k, v, do, scale=scale, block_n=block_n, vis=_vis(case, b, tq, tk))
  w_o, w_ohp, w_lse, w_m, w_dq, w_dk, w_dv = want
  assert_close(_f(o), w_o, rel=OUT_BOUND, name="O")
  assert_close(_f(o_hp), w_ohp, rel=OUT_BOUND, name="O'")
  fin = lambda x: np.where(np.isinf(x), 0.0, x)
  assert (np.isinf(_f(lse)) == np.isinf(w_lse)).all() and (np.isinf(_f(m)) == np.isinf(w_m)).all()
  assert_close(fin(_f(lse)), fin(w_lse), rel=1e-5, name="lse")  # FP32 log-sum-exp
  assert_close(fin(_f(m)), fin(w_m), rel=1e-5, name="row_max")
  for name, got, exp in (("dQ", dq, w_dq), ("dK", dk, w_dk), ("dV", dv, w_dv)):
    assert_close(_f(got), exp, rel=GRAD_BOUND, name=name)


def test_row_mode_grad_matches_explicit_backward():
  """jax.grad of jqat.attention(p_scale="row") is the explicit backward fed with the forward's row_max."""
  q, k, v, do = _inputs(1, 24, 40, 2, 1, 32, seed=1)
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, implementation="xla", p_scale="row").astype(jnp.float32)
                                 * do.astype(jnp.float32))
  grads = jax.grad(loss, (0, 1, 2))(q, k, v)
  o, o_hp, lse, m = jqat.attention_forward(q, k, v, implementation="xla", p_scale="row")
  want = jqat.attention_backward(do, q, k, v, o_hp, lse, implementation="xla", p_scale="row", row_max=m)
  for name, got, exp in zip(("dQ", "dK", "dV"), grads, want):
    assert_reordered_equal(_f(got), _f(exp), name=name, dtype=jnp.bfloat16)  # two XLA programs


def test_row_mode_fully_masked_row():
  """A row with no visible key: O = O' = 0, lse = row_max = -inf, and its gradients are exactly zero."""
  q, k, v, do = _inputs(1, 8, 32, 1, 1, 16, seed=2)
  kw = dict(query_seq_lengths=jnp.array([5], jnp.int32), implementation="xla", p_scale="row")
  o, o_hp, lse, m = jqat.attention_forward(q, k, v, **kw)
  assert (_f(o)[:, 5:] == 0).all() and (_f(o_hp)[:, 5:] == 0).all()
  assert (_f(lse)[..., 5:] == -np.inf).all() and (_f(m)[..., 5:] == -np.inf).all()
  assert np.isfinite(_f(o)).all() and np.isfinite(_f(lse)[..., :5]).all()
  dq, dk, dv = jqat.attention_backward(do, q, k, v, o_hp, lse, row_max=m, **kw)
  assert (_f(dq)[:, 5:] == 0).all()
  assert np.isfinite(_f(dk)).all() and np.isfinite(_f(dv)).all()
  # Rows past the length add nothing to dK, dV: the same as attention over the live rows alone.
  live = [x[:, :5] for x in (q, do)]
  o5, o5_hp, lse5, m5 = jqat.attention_forward(live[0], k, v, implementation="xla", p_scale="row")
  _, dk5, dv5 = jqat.attention_backward(live[1], live[0], k, v, o5_hp, lse5, implementation="xla", p_scale="row",
                                        row_max=m5)
  assert_close(_f(dk), _f(dk5), rel=1e-6, name="dK")
  assert_close(_f(dv), _f(dv5), rel=1e-6, name="dV")


def test_block_mode_unchanged_by_the_keyword():
  """p_scale="block" is the default: the same program, three outputs, no row_max accepted."""
  q, k, v, do = _inputs(1, 16, 32, 1, 1, 16, seed=3)
  a = jqat.attention_forward(q, k, v, implementation="xla")
  b = jqat.attention_forward(q, k, v, implementation="xla", p_scale="block")
  assert len(a) == len(b) == 3
  for x, y in zip(a, b):
    np.testing.assert_array_equal(_f(x), _f(y))
  with pytest.raises(ValueError, match="row_max"):
    jqat.attention_backward(do, q, k, v, a[1], a[2], implementation="xla", row_max=a[2])
  with pytest.raises(ValueError, match="row_max"):
    jqat.attention_backward(do, q, k, v, a[1], a[2], implementation="xla", p_scale="row")
  with pytest.raises(ValueError, match="p_scale"):
    jqat.attention(q, k, v, implementation="xla", p_scale="tensor")


def test_row_mode_keeps_dv_of_long_diffuse_rows():
  """The defect of issue 11, on the CPU reference: one head, D = 128, logits N(0, 1), T = 4096 keys.

  Under "block" most of fq(P) is exactly 0 (P ~ 1/T sits below the 2^-9 scale floor's reach) and dV
  is far from exact attention's; "row" quantizes relative to the row max and keeps it.
  """
  t, d, rows = 4096, 128, 32
  rng = np.random.default_rng(0)
  # Q, K with unit-variance logits at scale 1/sqrt(D): S = q.k / sqrt(D) ~ N(0, 1).
  q = jnp.asarray(rng.normal(0, 1, (1, rows, 1, d)), jnp.float32)
  k = jnp.asarray(rng.normal(0, 1, (1, t, 1, d)), jnp.float32)
  v = jnp.asarray(rng.normal(0, 1, (1, t, 1, d)), jnp.float32)
  do = jnp.asarray(rng.normal(0, 1, (1, rows, 1, d)), jnp.float32)
  cfg = QATConfig(quantize_qkv=False)  # isolate the P path
  s = np.einsum("qd,kd->qk", np.asarray(q[0, :, 0], np.float64), np.asarray(k[0, :, 0], np.float64)) / np.sqrt(d)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  exact_dv = p.T @ np.asarray(do[0, :, 0], np.float64)
  zeros = float(np.mean(_fq64(p) == 0))
  assert zeros > 0.8, f"share of exact zeros in block fq(P): {zeros:.3f}"
  errs = {}
  for mode in ("block", "row"):
    fwd = reference.forward(q, k, v, scale=d**-0.5, is_causal=False, block_n=64, cfg=cfg, p_scale=mode)
    _, _, dv = reference.backward(do, q, k, v, fwd[1], fwd[2], scale=d**-0.5, is_causal=False, cfg=cfg,
                                  p_scale=mode, row_max=fwd[3] if mode == "row" else None)
    got = np.asarray(dv[0, :, 0], np.float64)
    errs[mode] = np.linalg.norm(got - exact_dv) / np.linalg.norm(exact_dv)
  # The table at T = 4096: 0.52 (block) against 0.09 (row).
  assert errs["block"] > 0.4, errs
  assert errs["row"] < 0.15, errs


def test_row_mode_through_flax_and_torch():
  """The Flax adapter and jqat.torch.attention pass p_scale through: the same output and gradients as jqat."""
  q, k, v, do = _inputs(1, 24, 40, 2, 2, 32, seed=4)
  want = jqat.attention(q, k, v, implementation="xla", p_scale="row")
  # Not the same program as "block": the outputs differ (else this test could not see a dropped keyword).
  assert not np.array_equal(_f(want), _f(jqat.attention(q, k, v, implementation="xla")))
  fn = make_attention_fn(implementation="xla", p_scale="row")
  got = fn(q, k, v)
  assert_close(_f(got), _f(want), rel=1e-6, name="flax O")
  with pytest.raises(ValueError, match="p_scale"):
    make_attention_fn(p_scale="rows")

  to_t = lambda x: torch.from_numpy(np.array(jnp.swapaxes(x, 1, 2).astype(jnp.float32))).to(torch.bfloat16)
  qt, kt, vt = (to_t(x).requires_grad_() for x in (q, k, v))
  out = jqat.torch.attention(qt, kt, vt, p_scale="row")
  assert_close(out.detach().float().numpy(), np.swapaxes(_f(want), 1, 2), rel=1e-6, name="torch O")
  out.backward(to_t(do))
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, implementation="xla", p_scale="row").astype(jnp.float32)
                                 * do.astype(jnp.float32))
  grads = jax.grad(loss, (0, 1, 2))(q, k, v)
  for name, t, g in zip(("dQ", "dK", "dV"), (qt, kt, vt), grads):
    assert_reordered_equal(t.grad.float().numpy(), np.swapaxes(_f(g), 1, 2), name=f"torch {name}",
                           dtype=jnp.bfloat16)


OFF = dict(quantize_qkv=False, quantize_p=False, high_precision_delta=True, quantize_p_backward=False)


# dQ = bf16(dS) @ K and dK = bf16(dS)^T @ Q (docs/NUMERICS.md, section 5) round dS to bf16 (2^-9 relative) before the
# sum over keys that would cancel the mean's share exactly: against keys whose common component (3) is 3x
# their spread, the un-smoothed dQ carries ~3 * 2^-9 of extra rounding (measured 6e-3), dK 5e-4 through
# the mean's chain rule; dV = bf16(P)^T dO sees the same P up to FP32 noise.
GRAD_NO_Q = {"dQ": 1.5e-2, "dK": 2e-3, "dV": 1e-5}


def test_smooth_k_is_invisible_without_quantization():
  """Quantization off (FP32 inputs): subtracting the mean key changes O and the gradients only by FP32
  rounding (each score moves by the constant q.mean, which the softmax removes); padded keys may hold NaN."""
  rng = np.random.default_rng(5)
  q, k, v, do = (jnp.asarray(rng.normal(0, 1, s), jnp.float32) for s in ((2, 16, 2, 32), (2, 24, 1, 32),
                                                                           (2, 24, 1, 32), (2, 16, 2, 32)))
  k = k + 3.0  # a large common component: what SmoothK removes
  kv_len = jnp.array([24, 13], jnp.int32)
  k_nan = k.at[1, 13:].set(jnp.nan)  # never read: must not leak through the mean
  run = lambda k, smooth: jax.vjp(
      lambda q, k, v: jqat.attention(q, k, v, implementation="xla", is_causal=True, key_value_seq_lengths=kv_len,
                                     smooth_k=smooth, **OFF), q, k, v)
  o_ref, vjp_ref = run(k, False)
  o, vjp = run(k_nan, True)
  assert_close(_f(o), _f(o_ref), rel=1e-5, name="O")
  g_ref, g = vjp_ref(do), vjp(do)
  for name, a, e in zip(("dQ", "dK", "dV"), g, g_ref):
    assert np.isfinite(_f(a)).all(), name
    assert_close(_f(a), _f(e), rel=GRAD_NO_Q[name], name=name)
  assert (_f(g[1])[1, 13:] == 0).all()  # padded keys: no gradient


def test_smooth_k_gradient_is_autodiff_through_the_mean():
  """With quantization on: jax.grad of jqat.attention(smooth_k=True) equals the explicit backward's dK, which
  chains the kernel-rule dK of the smoothed keys through the mean; and smoothing changes the quantized O."""
  q, k, v, do = _inputs(1, 16, 40, 2, 1, 32, seed=6)
  k = (k.astype(jnp.float32) + 2.0).astype(jnp.bfloat16)
  kw = dict(implementation="xla", key_value_seq_lengths=jnp.array([33], jnp.int32))
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, smooth_k=True, **kw).astype(jnp.float32)
                                 * do.astype(jnp.float32))
  grads = jax.grad(loss, (0, 1, 2))(q, k, v)
  o, o_hp, lse = jqat.attention_forward(q, k, v, smooth_k=True, **kw)
  want = jqat.attention_backward(do, q, k, v, o_hp, lse, smooth_k=True, **kw)
  for name, got, exp in zip(("dQ", "dK", "dV"), grads, want):
    assert_reordered_equal(_f(got), _f(exp), name=name, dtype=jnp.bfloat16)
  # The chain rule by hand: live keys' dK is dK_s minus its mean over live keys; padded keys get 0.
  ks = jqat._src.attention.smooth_keys(k, kw["key_value_seq_lengths"])
  _, dk_s, _ = jqat.attention_backward(do, q, ks, v, o_hp, lse, **kw)
  dk_s = _f(dk_s)
  by_hand = np.where(np.arange(40)[None, :, None, None] < 33, dk_s - dk_s[:, :33].mean(1, keepdims=True), 0.0)
  assert_close(_f(grads[1]), by_hand, rel=1e-2, name="dK by hand")  # bf16 rounding of dK_s and of the result
  assert not np.array_equal(_f(o), _f(jqat.attention_forward(q, k, v, **kw)[0]))


def test_smooth_k_through_torch():
  """jqat.torch.attention(smooth_k=True) smooths with a torch op: O and dK as jqat's (NaN padded keys too)."""
  q, k, v, do = _inputs(2, 16, 24, 2, 1, 32, seed=7)
  k = k.at[1, 20:].set(jnp.nan)
  kv_len = jnp.array([24, 20], jnp.int32)
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, implementation="xla", smooth_k=True,
                                                key_value_seq_lengths=kv_len).astype(jnp.float32)
                                 * do.astype(jnp.float32))
  want, grads = jax.value_and_grad(loss, (0, 1, 2))(q, k, v)
  to_t = lambda x: torch.from_numpy(np.array(jnp.swapaxes(x, 1, 2).astype(jnp.float32))).to(torch.bfloat16)
  qt, kt, vt = (to_t(x).requires_grad_() for x in (q, k, v))
  out = jqat.torch.attention(qt, kt, vt, enable_gqa=True, smooth_k=True,
                             key_value_seq_lengths=torch.tensor([24, 20], dtype=torch.int32))
  got = (out.float() * to_t(do).float()).sum()
  got.backward()
  # torch's and JAX's FP32 means sum in different orders: a last-bit change of a smoothed key can flip one
  # of its fq codes (one E2M1 step of one element), so the two agree to the fq-flip bound, not bitwise.
  assert abs(float(got) - float(want)) <= 1e-3 * abs(float(want))
  for name, t, g in zip(("dQ", "dK", "dV"), (qt, kt, vt), grads):
    assert np.isfinite(t.grad.float().numpy()).all(), name
    assert_close(t.grad.float().numpy(), np.swapaxes(_f(g), 1, 2), rel=1e-2, name=f"torch {name}")


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


def test_tensor_scale_quantizer_is_bitwise_the_oracle():
  """fq(enc * x) and 1 / enc bit for bit, over magnitudes past 2688 and below the 2^-9 block floor, with
  lengths, a zero slab, and a NaN and an Inf slab."""
  rng = np.random.default_rng(8)
  x = rng.normal(0, 1, (3, 20, 4, 32)).astype(np.float32) * np.float32([1e4, 1.0, 1e-5])[:, None, None, None]
  x = x.astype(jnp.bfloat16).astype(np.float32)
  x[0, :, 1] = 0.0
  x[1, 3, 2, 5] = np.nan
  x[2, 7, 3, 0] = np.inf
  length = np.array([20, 11, 5], np.int32)
  for ln in (None, length):
    y, dec = reference.fq_tensor(jnp.asarray(x, jnp.bfloat16), None if ln is None else jnp.asarray(ln))
    wy, wdec = fq_tensor_oracle(x, ln)
    np.testing.assert_array_equal(bits(np.asarray(y)), bits(wy))
    np.testing.assert_array_equal(bits(np.asarray(dec)), bits(wdec))
  # What the second level buys: block scales saturate at 448 (|x| <= 2688) and floor at 2^-9.
  deq = np.asarray(y) * np.asarray(dec)
  def err(a, b):
    live = np.isfinite(x[b]) & (np.arange(20)[:, None, None] < length[b])
    return np.linalg.norm(np.where(live, a - x[b], 0)) / np.linalg.norm(np.where(live, x[b], 0))

  for b, name in ((0, "large"), (2, "tiny")):
    assert err(deq[b], b) < 0.15, name  # E2M1's 3 bits: ~0.1 relative
    assert err(np.asarray(reference._fq(jnp.asarray(x[b:b + 1])))[0], b) > 0.5, name


def test_div_rn_is_ieee_division():
  """The reference's encode and decode scales divide with ``div_rn``: NumPy's IEEE FP32 division bit for bit,
  on whatever backend runs the test (XLA's GPU division was one ulp off on the H200), over random bit patterns
  (subnormals included), results that overflow to inf or fall to subnormals, and ``den = inf``."""
  rng = np.random.default_rng(11)
  den = rng.integers(1, 0x7F800000, 200_000, dtype=np.int64).astype(np.uint32).view(np.float32)
  den = np.concatenate([den, np.float32([1e-45, 1.1754942e-38, 1.1754944e-38, 3.4028235e38, 1.0, 3.0, 448.0,
                                         2688.0, np.inf])])
  div = jax.jit(reference.div_rn)
  for num in np.float32([2688.0, 1.0, 1e-45, 3.4028235e38, 0.1, 7e-39]):
    with np.errstate(over="ignore", under="ignore"):
      want = (num / den).astype(np.float32)
    np.testing.assert_array_equal(bits(np.asarray(div(jnp.float32(num), jnp.asarray(den)))), bits(want),
                                  err_msg=f"{num} / den")


def test_tensor_scale_attention_matches_float64_oracle():
  """qkv_scale="tensor": forward and gradients against the float64 oracle fed the oracle's two-level Q, K, V
  (with lengths); NaN in a live key reaches the output. (The Triton kernels: tests/test_numerics_modes_triton.py.)"""
  rng = np.random.default_rng(9)
  q = (rng.normal(0, 1, (2, 24, 2, 32)) * 3e3).astype(np.float32)  # past 2688: block scales would saturate
  k = (rng.normal(0, 1, (2, 40, 1, 32)) * 1e-4).astype(np.float32)  # below the floor: block fq gives 0
  v = rng.normal(0, 1, (2, 40, 1, 32)).astype(np.float32)
  do = rng.normal(0, 1, (2, 24, 2, 32)).astype(np.float32)
  q, k, v, do = (x.astype(jnp.bfloat16).astype(np.float32) for x in (q, k, v, do))
  kv_len = np.array([40, 29], np.int32)
  scale = 32**-0.5 * 3.0
  kw = dict(scale=scale, implementation="xla", qkv_scale="tensor", key_value_seq_lengths=jnp.asarray(kv_len))
  jq, jk, jv, jdo = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, do))
  o, o_hp, lse = jqat.attention_forward(jq, jk, jv, block_n=16, **kw)
  dq, dk, dv = jqat.attention_backward(jdo, jq, jk, jv, o_hp, lse, **kw)
  deq = [np.asarray(y * dec, np.float32) for y, dec in (fq_tensor_oracle(q), fq_tensor_oracle(k, kv_len),
                                                         fq_tensor_oracle(v, kv_len))]
  vis = visible_oracle(2, 24, 40, kv_len=kv_len)
  w_o, w_ohp, w_lse = attention_oracle(*deq, scale=scale, is_causal=False, block_n=16, quantize_qkv=False, vis=vis)
  assert_close(_f(o), w_o, rel=OUT_BOUND, name="O")
  assert_close(_f(lse), w_lse, rel=1e-5, name="lse")
  grads = attention_grad_oracle(do, *deq, _f(o_hp), _f(lse), scale=scale, is_causal=False, quantize_qkv=False,
                                vis=vis)
  for name, got, want in zip(("dQ", "dK", "dV"), (dq, dk, dv), grads):
    assert_close(_f(got), want, rel=GRAD_BOUND, name=name)
  # NaN in a live key: its (batch, head) slab falls back to block scales and the NaN block reaches O.
  bad = jk.at[0, 3, 0, 0].set(jnp.nan)
  assert np.isnan(_f(jqat.attention(jq, bad, jv, **kw))[0]).all()
  # The torch shim (CPU tensors: the XLA reference) and the Flax adapter pass it through.
  want = _f(jqat.attention(jq, jk, jv, **kw))
  to_t = lambda x: torch.from_numpy(np.array(jnp.swapaxes(x, 1, 2).astype(jnp.float32))).to(torch.bfloat16)
  got = jqat.torch.attention(to_t(jq), to_t(jk), to_t(jv), scale=scale, enable_gqa=True, qkv_scale="tensor",
                             key_value_seq_lengths=torch.from_numpy(kv_len))
  assert_close(np.swapaxes(got.float().numpy(), 1, 2), want, rel=1e-6, name="torch O")
  fn = make_attention_fn(implementation="xla", qkv_scale="tensor")
  assert_close(_f(fn(jq, jk, jv)), _f(jqat.attention(jq, jk, jv, implementation="xla", qkv_scale="tensor")),
               rel=1e-6, name="flax O")
