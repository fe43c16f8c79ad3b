"""examples/grad_fidelity.py: the float64 straight-through reference against tests/oracle.py's NumPy walk."""

import json

import grad_fidelity  # noqa: E402
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import train_lm  # noqa: E402
from conftest import assert_close
from oracle import attention_oracle, fq_oracle, row_oracle, visible_oracle

from jqat._src.attention import smooth_keys


def _numpy_ste(q, k, v, do, *, scale, is_causal, block_n, p_scale, smooth_k, quantized):
  """The module docstring's formulas in NumPy, with the forward's quantized probabilities Pt read off the
  independent oracles' tile walk: with V = I (fq(I) = c * I, c = 1.03125), their O is c * Pt."""
  q, k, v, do = (np.asarray(jnp.asarray(x, jnp.float32), np.float32) for x in (q, k, v, do))
  if smooth_k:
    k = (k - k.mean(axis=1, keepdims=True, dtype=np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  prep = (lambda x: fq_oracle(x).astype(np.float64)) if quantized else (lambda x: x.astype(np.float64))
  qh, khat, vh = prep(q), prep(k), prep(v)
  kr, vr = np.repeat(khat, n // kh, axis=2), np.repeat(vh, n // kh, axis=2)
  vis = visible_oracle(b, tq, tk, is_causal=is_causal)[:, None]
  s = np.where(vis, scale * np.einsum("bqnd,bknd->bnqk", qh, kr), -np.inf)
  e = np.exp(s - s.max(-1, keepdims=True))
  p = e / e.sum(-1, keepdims=True)
  if quantized:
    c = fq_oracle(np.eye(d, dtype=np.float32))
    assert np.all(c == c[0, 0] * np.eye(d))  # a one-hot row quantizes to one multiple of itself
    chunks = []
    for start in range(0, tk, d):  # the oracles' V has q's head dim: D keys of Pt per call
      eye = np.zeros((b, tk, kh, d), np.float32)
      for j in range(start, min(start + d, tk)):
        eye[:, j, :, j - start] = 1
      if p_scale == "row":
        o = row_oracle(q, k, eye, do, scale=scale, block_n=block_n, vis=vis[:, 0])[0]
      else:
        o = attention_oracle(q, k, eye, scale=scale, is_causal=is_causal, block_n=block_n)[0]
      chunks.append(o[..., :min(d, tk - start)])
    pt = np.concatenate(chunks, -1).transpose(0, 2, 1, 3) / np.float64(c[0, 0])  # [B, N, Tq, Tk]
  else:
    pt = p
  do = do.astype(np.float64)
  dp = np.einsum("bqnd,bknd->bnqk", do, vr)
  ds = p * (dp - (p * dp).sum(-1, keepdims=True))
  fold = lambda x: x.reshape(b, tk, kh, n // kh, d).sum(axis=3)
  dq = scale * np.einsum("bnqk,bknd->bqnd", ds, kr)
  dk = fold(scale * np.einsum("bnqk,bqnd->bknd", ds, qh))
  dv = fold(np.einsum("bnqk,bqnd->bknd", pt, do))
  if smooth_k:
    dk = dk - dk.mean(axis=1, keepdims=True)
  return dq, dk, dv


def _inputs(b, tq, tk, n, kh, d, seed=0):
  rng = np.random.default_rng(seed)
  # A channel offset in K (what SmoothK removes) and spread-out scores, so fq(P) has many small values.
  q = rng.normal(0, 2, (b, tq, n, d))
  k = rng.normal(0, 1, (b, tk, kh, d)) + rng.normal(0, 3, (1, 1, kh, d))
  v, do = rng.normal(0, 1, (b, tk, kh, d)), rng.normal(0, 1, (b, tq, n, d))
  return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, do))


@pytest.mark.parametrize("p_scale,smooth_k,quantized,is_causal,tq", [
    ("block", False, True, True, 40), ("block", False, True, False, 23), ("row", False, True, True, 40),
    ("block", True, True, True, 40), ("block", False, False, True, 40)])
def test_ste_reference_matches_numpy_oracle(p_scale, smooth_k, quantized, is_causal, tq):
  # Odd lengths: a partial KV tile, a partial fq block of 16 keys and a partial query block; GQA 4:2.
  b, tk, n, kh, d, block_n = 2, 40 if is_causal else 37, 4, 2, 32, 16
  q, k, v, do = _inputs(b, tq, tk, n, kh, d)
  scale = d**-0.5
  with jax.enable_x64(True):
    got = grad_fidelity.ste_gradients(q, k, v, do, scale=scale, is_causal=is_causal, block_n=block_n,
                                      p_scale=p_scale, smooth_k=smooth_k, quantized=quantized, block_q=16)
  assert all(g.dtype == np.float64 for g in got)
  want = _numpy_ste(q, k, v, do, scale=scale, is_causal=is_causal, block_n=block_n, p_scale=p_scale,
                    smooth_k=smooth_k, quantized=quantized)
  # Float64 rounding only: both sides use the same fq codes (fp32 inputs, the spec's exact quantizer), and
  # their sums differ in order over <= 40 keys.
  for name, g, w in zip(("dQ", "dK", "dV"), got, want):
    assert_close(g, w, rel=1e-12, name=name)


def test_ste_reference_quantizes_the_smoothed_key_it_is_given():
  """smoothed_key: the reference quantizes exactly those bits (the fidelity table passes jqat's own SmoothK key:
  the same mean rounded in another XLA program may differ in its last place, and NVFP4 codes flip with it)."""
  b, tq, tk, n, kh, d = 1, 40, 40, 2, 2, 32
  q, k, v, do = _inputs(b, tq, tk, n, kh, d)
  k_smooth = smooth_keys(k)
  nudged = k_smooth.at[0, 3, 1, 5].add(1.0)
  kw = dict(scale=d**-0.5, is_causal=True, block_n=16, p_scale="block", quantized=True)
  with jax.enable_x64(True):
    given = grad_fidelity.ste_gradients(q, k, v, do, smooth_k=True, smoothed_key=k_smooth, block_q=16, **kw)
    moved = grad_fidelity.ste_gradients(q, k, v, do, smooth_k=True, smoothed_key=nudged, block_q=16, **kw)
    with pytest.raises(ValueError, match="smoothed_key"):
      grad_fidelity.ste_gradients(q, k, v, do, smooth_k=True, smoothed_key=k_smooth[:, :1], **kw)
    with pytest.raises(ValueError, match="smoothed_key.*smooth_k=True"):  # not silently ignored
      grad_fidelity.ste_gradients(q, k, v, do, smoothed_key=k_smooth, **kw)
  # The oracle on the same key (no smoothing of its own; dK projected as SmoothK's gradient does).
  want = _numpy_ste(q, k_smooth, v, do, smooth_k=False, **kw)
  want = (want[0], want[1] - want[1].mean(axis=1, keepdims=True), want[2])
  for name, g, w in zip(("dQ", "dK", "dV"), given, want):
    assert_close(g, w, rel=1e-12, name=name)
  assert not np.array_equal(np.asarray(moved[0]), np.asarray(given[0]))  # the given bits are what is read


def test_ste_reference_tiles_the_running_max():
  """Pt depends on the KV tile: a block_n other than the forward's changes dV (the check has power)."""
  q, k, v, do = _inputs(1, 64, 64, 2, 2, 32, seed=1)
  with jax.enable_x64(True):
    a = grad_fidelity.ste_gradients(q, k, v, do, block_n=16, block_q=32)[2]
    b = grad_fidelity.ste_gradients(q, k, v, do, block_n=64, block_q=32)[2]
  assert grad_fidelity.rel_err(a, b) > 1e-4


def test_ste_reference_input_checks():
  q, k, v, do = _inputs(1, 16, 16, 2, 2, 16)
  with pytest.raises(RuntimeError, match="enable_x64"):
    grad_fidelity.ste_gradients(q, k, v, do)
  with jax.enable_x64(True):
    with pytest.raises(ValueError, match="p_scale"):
      grad_fidelity.ste_gradients(q, k, v, do, p_scale="tensor")
    with pytest.raises(ValueError, match="shapes"):
      grad_fidelity.ste_gradients(q, k[:, :, :1].repeat(3, 2), v, do)
    with pytest.raises(ValueError, match="block_n"):
      grad_fidelity.ste_gradients(q, k, v, do, block_n=24)


def test_fidelity_table_on_cpu(tmp_path):
  """End to end on an untrained tiny checkpoint, the XLA reference: every variant."""
  cfg = train_lm.CONFIGS["tiny"]
  path = str(tmp_path / "ckpt.npz")
  train_lm.save_checkpoint(path, train_lm.make_model(cfg, {}), cfg)
  out = tmp_path / "fidelity.json"
  rows = grad_fidelity.main(["--checkpoint", path, "--lengths", "48", "--implementation", "xla",
                             "--block-q", "32", "--out", str(out)])
  assert [(r["T"], r["variant"]) for r in rows] == [(t, v) for t in (48,) for v in grad_fidelity.VARIANTS]
  assert json.loads(out.read_text())["rows"] == rows
  for r in rows:
    errs = [r[f"{g}_{ref}"] for g in ("dq", "dk", "dv") for ref in ("ste", "exact")]
    assert all(np.isfinite(errs)), r
    if r["variant"] == "1 bf16":
      # Unquantized: the same reference; BF16 attention's own rounding (bf16 outputs and dS operand, 2^-9
      # relative each) is all that separates it from float64 exact attention.
      assert r["dq_ste"] == r["dq_exact"] and max(errs) < 1e-2, r
    else:
      assert max(errs) < 1.0, r  # a swapped or misaligned gradient would be ~1 or more


@pytest.mark.gpu
def test_fidelity_table_on_gpu_triton(tmp_path):
  """The Triton kernels at T = 1024 (several KV tiles): BF16 and Attn-QAT's dQ, dK near their references."""
  cfg = train_lm.CONFIGS["tiny"]
  path = str(tmp_path / "ckpt.npz")
  train_lm.save_checkpoint(path, train_lm.make_model(cfg, {}), cfg)
  rows = grad_fidelity.main(["--checkpoint", path, "--lengths", "1024", "--implementation", "triton",
                             "--out", str(tmp_path / "fidelity.json")])
  by = {r["variant"]: r for r in rows}
  # BF16 roundings (outputs, the dS operand; 2^-9 relative each) and exp2's last bit, as on the CPU.
  assert max(by["1 bf16"][f"{g}_exact"] for g in ("dq", "dk", "dv")) < 1e-2, by["1 bf16"]
  for name in ("4 attn-qat", "5 +smoothk", "6 +two-level-p", "8 -fq-p-bwd"):
    assert max(by[name]["dq_ste"], by[name]["dk_ste"]) < 1e-2, by[name]  # dS keeps the unquantized P
