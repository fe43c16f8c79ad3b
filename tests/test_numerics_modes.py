"""The numerics modes of docs/NUMERICS.md on every implementation: p_scale="row", qkv_scale="tensor", smooth_k.

The oracles are written from the definitions with NumPy (tests/oracle.py: ``row_oracle``, ``fq_tensor_oracle`` fed to
``attention_oracle``), not by calling the reference: R = 6 * 448; the forward accumulates fq(R * exp(S - m_running)) @ V
and divides by R * l; the backward's dV operand is fq(R * exp(S - m)) / (R * l) with m, l the final row max and row
sum, and dS keeps the unquantized P. Each case runs on every implementation (tests/cases.py); the kernels are also
held to the XLA reference's tighter bounds, and the interpreter's two-level Q, K, V are checked bit for bit.
"""

import cases
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cases import KERNEL_BOUNDS, KERNELS, MODES, Masks, f64, implementations, lengths, run, segments, zero_empty_rows
from cases import NO_MASKS as FULL
from cases import qkv as _qkv
from conftest import HAS_GPU, assert_close, assert_reordered_equal
from oracle import _fq64, attention_grad_oracle, attention_oracle, bits, fq_tensor_oracle, row_oracle

import jqat
import jqat.torch
from jqat._src import attention_reference as reference
from jqat.ffi.options import QATConfig
from jqat.flax import make_attention_fn

# FP32 work against a float64 oracle: bf16 output rounding (2^-9 relative) plus fq(P) codes flipped
# where exp's last-bit differences move a value across an E2M1 boundary; the same bounds as the
# block-mode reference tests.
OUT_BOUND = 2e-2
GRAD_BOUND = 2e-2
ORACLE_BOUNDS = {"O": OUT_BOUND, "O'": OUT_BOUND, "lse": 1e-5, "row_max": 1e-5, "dQ": GRAD_BOUND, "dK": GRAD_BOUND,
                 "dV": GRAD_BOUND}
_f = f64


def _inputs(b, tq, tk, n, kh, d, seed=0, spread=2.0):
  return _qkv((b, tq, tk, n, kh, d), seed, spread=(spread, 1.0, 1.0, 1.0))


def _reference(implementation, case_run):
  """The XLA reference on the same case for the kernels (one compile per case), else None."""
  return case_run("xla") if implementation in KERNELS else None


def _assert_kernel_bounds(implementation, got, ref):
  """Kernels: every output within KERNEL_BOUNDS of the reference (empty rows already zeroed in both)."""
  for key in got if ref is not None else ():
    assert_close(got[key], ref[key], rel=KERNEL_BOUNDS[key], name=f"{key} {implementation} vs reference")


# (B, Tq, Tk, N, K, D) and masks: partial tiles of 16 rows and 16 or 32 keys, GQA, rows that see no key.
ROW_CASES = {
    "full": ((1, 17, 40, 2, 1, 32), FULL),
    "causal-gqa": ((1, 40, 40, 2, 1, 16), Masks(is_causal=True)),
    "lengths": ((2, 20, 33, 1, 1, 16), lengths([20, 7], [9, 33])),
    "segments-empty-rows": ((1, 24, 32, 1, 1, 16), segments([[(0, 8), (1, 8), (5, 8)]], [[(0, 16), (1, 16)]])),
}


# jqat.torch on the CPU runs the XLA reference once more (a compile a case): there one row case (rows that see no key)
# and one tensor case (lengths, GQA); on a GPU (its CUDA kernels) every case.
TORCH_CASES = ("segments-empty-rows", "lengths-gqa")


def _params(cases, keep=lambda case, impl: True):
  return [pytest.param(impl.values[0], case, marks=impl.marks, id=f"{case}-{impl.id}")
          for case in cases for impl in implementations(slow=("interpreter",))
          if keep(case, impl.values[0]) and (impl.values[0] != "torch" or case in TORCH_CASES or HAS_GPU)]


@pytest.mark.parametrize("implementation, case", _params(ROW_CASES))
def test_row_mode_matches_float64_oracle(implementation, case):
  """p_scale="row": forward outputs, row_max and gradients against row_oracle; rows that see no key give
  O = O' = 0 and dQ = 0 exactly."""
  shape, masks = ROW_CASES[case]
  b, tq, tk, _, _, d = shape
  q, k, v, do = _inputs(*shape)
  case_run = lambda impl: run(impl, q, k, v, do, masks, MODES["row"])
  got = case_run(implementation)
  vis = masks.visible(b, tq, tk)
  want = dict(zip(("O", "O'", "lse", "row_max", "dQ", "dK", "dV"),
                  row_oracle(q, k, v, do, scale=d**-0.5, block_n=16, vis=vis)))
  ref = _reference(implementation, case_run)
  zero_empty_rows(got, want, *[ref] * (ref is not None))
  for key in got:
    assert_close(got[key], want[key], rel=ORACLE_BOUNDS[key], name=f"{key} vs float64")
  rows = ~vis.any(-1)  # [B, Tq]
  for key in ("O", "O'", "dQ"):
    if key in got:
      assert (got[key][rows] == 0).all(), key
  _assert_kernel_bounds(implementation, got, ref)


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
                                     smooth_k=smooth, **MODES["off"]), q, k, v)
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
  assert abs(got.item() - float(want)) <= 1e-3 * abs(float(want))
  for name, t, g in zip(("dQ", "dK", "dV"), (qt, kt, vt), grads):
    assert np.isfinite(t.grad.float().numpy()).all(), name
    assert_close(t.grad.float().numpy(), np.swapaxes(_f(g), 1, 2), rel=1e-2, name=f"torch {name}")


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




# Q past 2688 (block scales would saturate), K below the 2^-9 block floor (block fq would give 0), V moderate.
TENSOR_SPREAD = (3e3, 1e-4, 1.0, 1.0)
# (shape, masks, p_scale, scale): scores of order 1, Q.K ~ 3e3 * 1e-4 * sqrt(D).
TENSOR_CASES = {
    "lengths-gqa": ((2, 20, 33, 2, 1, 32), lengths([20, 13], [33, 9]), "block", 32**-0.5 * 3.0),
    "causal-segments-row": ((1, 24, 32, 1, 1, 16),
                            segments([[(0, 8), (1, 16)]], [[(0, 12), (1, 20)]], is_causal=True), "row", 16**-0.5 * 3.0),
    # Above D = 128 the forward reads fq(enc * Q) from the pass instead of rounding its own Q tile.
    "causal-d144": ((1, 19, 21, 1, 1, 144), Masks(is_causal=True, kv_len=np.array([17], np.int32)), "block",
                    144**-0.5 * 3.0),
}
# With p_scale="row" there is no float64 oracle of the two-level inputs: the kernels against the reference only.
_TENSOR_PARAMS = _params(TENSOR_CASES, lambda case, impl: TENSOR_CASES[case][2] == "block" or impl in KERNELS)


def _assert_two_level_bitwise(scratch, arrays, operands):
  """The kernels' fq(enc * X) and encode scales of Q, K, V are the oracle's bit for bit."""
  q_len, kv_len = operands[:2]
  for name, x, length in (("q", arrays[0], q_len), ("k", arrays[1], kv_len), ("v", arrays[2], kv_len)):
    y, dec = fq_tensor_oracle(np.asarray(x, np.float32), length)
    np.testing.assert_array_equal(bits(scratch[f"{name}_hat"]), bits(y), err_msg=f"fq(enc * {name})")
    np.testing.assert_array_equal(bits(np.float32(1) / scratch[f"{name}_enc"]), bits(dec.reshape(dec.shape[0], -1)),
                                  err_msg=f"{name} decode scale")


@pytest.mark.parametrize("implementation, case", _TENSOR_PARAMS)
def test_tensor_mode_matches_float64_oracle(implementation, case):
  """qkv_scale="tensor": outputs and gradients against the float64 oracle fed the oracle's two-level Q, K, V
  (p_scale="block"), the kernels also against the reference, and the interpreter's two-level Q, K, V bitwise."""
  shape, masks, p_scale, scale = TENSOR_CASES[case]
  b, tq, tk = shape[:3]
  q, k, v, do = _qkv(shape, 1, spread=TENSOR_SPREAD)
  mode = dict(qkv_scale="tensor", p_scale=p_scale)
  scratch = {} if implementation == "interpreter" else None
  case_run = lambda impl: run(impl, q, k, v, do, masks, mode, scale=scale, scratch=scratch if impl == implementation
                              else None)
  got = case_run(implementation)
  if scratch is not None:
    _assert_two_level_bitwise(scratch, (q, k, v), masks.operands())
  vis = masks.visible(b, tq, tk)
  want = {}
  if p_scale == "block":
    q_len, kv_len = masks.operands()[:2]
    deq = [y * dec for y, dec in (fq_tensor_oracle(np.asarray(x, np.float32), ln) for x, ln in
                                  zip((q, k, v), (q_len, kv_len, kv_len)))]
    kw = dict(scale=scale, is_causal=False, quantize_qkv=False, vis=vis)
    want.update(zip(("O", "O'", "lse"), attention_oracle(*deq, block_n=16, **kw)))
    o_hp, lse = got.get("O'", want["O'"]), got.get("lse", want["lse"])
    want.update(zip(("dQ", "dK", "dV"), attention_grad_oracle(np.asarray(do, np.float32), *deq, o_hp, lse, **kw)))
  ref = _reference(implementation, case_run)
  zero_empty_rows(got, want, *[ref] * (ref is not None))
  for key in want:
    if key in got:
      assert_close(got[key], want[key], rel=ORACLE_BOUNDS[key], name=f"{key} vs float64")
  rows = ~vis.any(-1)
  for key in ("O", "O'", "dQ"):
    if key in got:
      assert (got[key][rows] == 0).all(), key
  _assert_kernel_bounds(implementation, got, ref)


@pytest.mark.parametrize("implementation", implementations("xla", "interpreter", "triton", slow=("interpreter",)))
def test_tensor_mode_nan_and_inf(implementation):
  """qkv_scale="tensor" with non-finite inputs (docs/NUMERICS.md): a NaN in a live key makes its slab fall back
  to block scales and reaches every output of its batch (O, O', lse and all gradients); a NaN in a key past the
  length stays out of the amax; an Inf in Q saturates its slab's block scales."""
  shape, masks, _, scale = TENSOR_CASES["lengths-gqa"]  # its shapes and options: the reference compiled for it
  q, k, v, do = _qkv(shape, 2, spread=(1.0, 0.1, 1.0, 1.0))
  k = k.at[0, 3, 0, 0].set(jnp.nan)  # live: batch 0 is NaN throughout
  k = k.at[1, 20, 0, 5].set(jnp.nan)  # past kv_len[1] = 9: no effect
  q = q.at[1, 2, 1, 7].set(jnp.inf)  # batch 1, head 1: enc = 1, its block saturates at 2688
  mode = dict(qkv_scale="tensor")
  scratch = {} if implementation == "interpreter" else None
  got = run(implementation, q, k, v, do, masks, mode, scale=scale, scratch=scratch)
  if scratch is not None:
    _assert_two_level_bitwise(scratch, (q, k, v), masks.operands())
    assert scratch["k_enc"][0, 0] == 1.0 and scratch["q_enc"][1, 1] == 1.0 and scratch["k_enc"][1, 0] != 1.0
  for key in ("O", "O'", "lse", "dQ", "dK", "dV"):
    assert np.isnan(got[key][0]).all(), key
    assert np.isfinite(got[key][1][~np.isneginf(got[key][1])]).all(), key
  if implementation in KERNELS:
    ref = run("xla", q, k, v, do, masks, mode, scale=scale)
    got, ref = ({key: x[1:] for key, x in d.items()} for d in (got, ref))
    zero_empty_rows(got, ref)  # batch 1's rows past query_seq_lengths
    for key in ("O", "O'", "lse", "dQ", "dK", "dV"):
      assert_close(got[key], ref[key], rel=KERNEL_BOUNDS[key], name=f"{key} batch 1")


def test_tensor_mode_through_torch_and_flax():
  """The torch shim (CPU tensors: the XLA reference) and the Flax adapter pass qkv_scale through: jqat's O."""
  shape, masks, _, scale = TENSOR_CASES["lengths-gqa"]
  q, k, v, _ = _qkv(shape, 1, spread=TENSOR_SPREAD)
  kw = dict(scale=scale, implementation="xla", qkv_scale="tensor")
  want = _f(jqat.attention(q, k, v, **kw, **masks.keywords()))
  assert not np.array_equal(want, _f(jqat.attention(q, k, v, scale=scale, implementation="xla",
                                                    **masks.keywords())))
  to_t = lambda x: torch.from_numpy(np.array(jnp.swapaxes(x, 1, 2).astype(jnp.float32))).to(torch.bfloat16)
  got = jqat.torch.attention(to_t(q), to_t(k), to_t(v), scale=scale, enable_gqa=True, qkv_scale="tensor",
                             **masks.keywords(torch.from_numpy))
  assert_close(np.swapaxes(got.float().numpy(), 1, 2), want, rel=1e-6, name="torch O")
  fn = make_attention_fn(implementation="xla", qkv_scale="tensor")
  assert_close(_f(fn(q, k, v)), _f(jqat.attention(q, k, v, implementation="xla", qkv_scale="tensor")), rel=1e-6,
               name="flax O")


# ----------------------------------------------------------------------------- GPU: the public API at full size


def _np(t):
  return t.detach().float().cpu().numpy().astype(np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_row_triton_matches_xla_gpu(causal):
  """The public API on the GPU: p_scale="row" forward outputs and gradients, Triton against XLA."""
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (2, 1000, 8, 128), jnp.bfloat16) * 2
  k, v = (jax.random.normal(x, (2, 1000, 2, 128), jnp.bfloat16) for x in ks[1:3])
  do = jax.random.normal(ks[3], q.shape, jnp.bfloat16)
  res = {}
  for impl in ("triton", "xla"):
    o, o_hp, lse, m = jqat.attention_forward(q, k, v, is_causal=causal, implementation=impl, p_scale="row")
    grads = jqat.attention_backward(do, q, k, v, o_hp, lse, is_causal=causal, implementation=impl, p_scale="row",
                                    row_max=m)
    vjp = jax.vjp(lambda q, k, v, impl=impl: jqat.attention(q, k, v, is_causal=causal, implementation=impl,
                                                           p_scale="row"),
                  q, k, v)[1](do)
    res[impl] = [np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (o, o_hp, lse, m, *grads, *vjp)]
  for name, a, e in zip(("O", "O'", "lse", "row_max", "dQ", "dK", "dV", "vjp dQ", "vjp dK", "vjp dV"),
                        res["triton"], res["xla"]):
    assert_close(a, e, rel=KERNEL_BOUNDS.get(name.removeprefix("vjp "), 2e-3), name=name)


@pytest.mark.gpu
def test_row_torch_cuda_matches_cpu_gpu():
  """jqat.torch.attention(p_scale="row", smooth_k=True): the CUDA kernels (row_max through the custom op's
  autograd) against the CPU path (the XLA reference through DLPack)."""
  gen = torch.Generator().manual_seed(0)
  shapes = ((2, 8, 700, 128), (2, 2, 700, 128), (2, 2, 700, 128), (2, 8, 700, 128))
  q, k, v, do = (torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes)
  res = {}
  for device in ("cuda", "cpu"):
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    out = jqat.torch.attention(*leaves, is_causal=True, enable_gqa=True, p_scale="row", smooth_k=True)
    out.backward(do.to(device))
    res[device] = [_np(t) for t in (out, *(x.grad for x in leaves))]
  for name, a, e in zip(("O", "dQ", "dK", "dV"), res["cuda"], res["cpu"]):
    assert_close(a, e, rel=KERNEL_BOUNDS[name], name=name)


@pytest.mark.gpu
@pytest.mark.parametrize("p_scale", ["block", "row"])
def test_tensor_triton_matches_xla_gpu(p_scale):
  """The public API on the GPU with qkv_scale="tensor" (GQA, causal, lengths, Q past 2688 and K below the block
  floor): forward outputs, explicit backward and vjp, Triton against XLA."""
  ks = jax.random.split(jax.random.key(1), 4)
  q = jax.random.normal(ks[0], (2, 1000, 8, 128), jnp.bfloat16) * 3e3
  k = jax.random.normal(ks[1], (2, 1000, 2, 128), jnp.bfloat16) * 1e-4
  v = jax.random.normal(ks[2], (2, 1000, 2, 128), jnp.bfloat16)
  do = jax.random.normal(ks[3], q.shape, jnp.bfloat16)
  kw = dict(scale=128**-0.5 * 3.0, is_causal=True, p_scale=p_scale, qkv_scale="tensor",
            query_seq_lengths=jnp.array([1000, 611]), key_value_seq_lengths=jnp.array([873, 1000]))
  res = {}
  for impl in ("triton", "xla"):
    fwd = jqat.attention_forward(q, k, v, implementation=impl, **kw)
    grads = jqat.attention_backward(do, q, k, v, fwd[1], fwd[2], implementation=impl,
                                    row_max=fwd[3] if p_scale == "row" else None, **kw)
    vjp = jax.vjp(lambda q, k, v, impl=impl: jqat.attention(q, k, v, implementation=impl, **kw), q, k, v)[1](do)
    res[impl] = [np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (*fwd, *grads, *vjp)]
  names = [n for n in cases.NAMES if p_scale == "row" or n != "row_max"]
  got, ref = (dict(zip(names + ["vjp dQ", "vjp dK", "vjp dV"], res[i])) for i in ("triton", "xla"))
  zero_empty_rows(got, ref)
  for name in got:
    assert_close(got[name], ref[name], rel=KERNEL_BOUNDS[name.removeprefix("vjp ")], name=name)


@pytest.mark.gpu
def test_tensor_torch_cuda_matches_cpu_gpu():
  """jqat.torch.attention(qkv_scale="tensor") with key lengths: the CUDA kernels against the CPU path (the XLA
  reference through DLPack)."""
  gen = torch.Generator().manual_seed(1)
  shapes = ((2, 8, 700, 128), (2, 2, 700, 128), (2, 2, 700, 128), (2, 8, 700, 128))
  q, k, v, do = (torch.randn(s, generator=gen).to(torch.bfloat16) * sp for s, sp in zip(shapes, (1e3, 1e-3, 1, 1)))
  res = {}
  for device in ("cuda", "cpu"):
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    out = jqat.torch.attention(*leaves, enable_gqa=True, scale=128**-0.5, qkv_scale="tensor",
                               key_value_seq_lengths=torch.tensor([700, 333], device=device))
    out.backward(do.to(device))
    res[device] = [_np(t) for t in (out, *(x.grad for x in leaves))]
  for name, a, e in zip(("O", "dQ", "dK", "dV"), res["cuda"], res["cpu"]):
    assert_close(a, e, rel=KERNEL_BOUNDS[name], name=name)
