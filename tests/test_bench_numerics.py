"""benchmarks/numerics_modes.py's tiled exact reference (against autodiff) and benchmarks/attention.py's plan-based
memory accounting (against arithmetic on the shapes)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def _load_bench(name):
  """A benchmarks/ script as a module; benchmarks/ is on sys.path (and its modules imported) only while it loads."""
  path, modules = list(sys.path), set(sys.modules)
  try:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  finally:
    sys.path[:] = path
    for imported in ("attention", "fastvideo", "_timing"):
      if imported not in modules:
        sys.modules.pop(imported, None)
  return mod


bench = _load_bench("numerics_modes")
attention_bench = _load_bench("attention")


def _inputs(b, tq, tk, n, kh, d, seed):
  """q, d_out: [b, tq, n, d]; k, v: [b, tk, kh, d]; float32 (NumPy's generator: no per-op compiles)."""
  rng = np.random.default_rng(seed)
  q, do = (rng.standard_normal((b, tq, n, d), np.float32) for _ in range(2))
  k, v = (rng.standard_normal((b, tk, kh, d), np.float32) for _ in range(2))
  return 3 * q, k, v, do  # logits ~ N(0, 9): peaked rows as well as diffuse ones


@functools.partial(jax.jit, static_argnums=4)
def _autodiff(q, k, v, do, causal):
  f = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
  out, vjp = jax.vjp(f, q, k, v)
  return out, vjp(do)


@functools.partial(jax.jit, static_argnums=4)
def _autodiff_dense(q, k, v, do, causal):
  """Plain softmax attention by autodiff in the inputs' dtype (jax.nn.dot_product_attention computes its
  softmax in FP32 even for FP64 inputs); k, v: one KV head per query head's group, repeated here."""
  g = q.shape[2] // k.shape[2]

  def f(q, k, v):
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
      s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
    return jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(s, axis=-1), v)

  out, vjp = jax.vjp(f, q, k, v)
  return out, vjp(do)


def test_tiled_reference_float32_matches_autodiff():
  # GQA, causal, Tq odd and not a multiple of block_q (padded rows), three blocks.
  q, k, v, do = _inputs(b=2, tq=37, tk=37, n=4, kh=2, d=16, seed=0)
  want_o, want = _autodiff(q, k, v, do, True)
  got_o, got = bench.exact_attention_vjp(q, k, v, do, is_causal=True, block_q=16, dtype=jnp.float32)
  # Both FP32 with exact (HIGHEST) products; they differ in summation order and in where the softmax
  # normalizes (before P @ V here), so a few ulps; a wrong mask, block offset or delta moves the result by O(1).
  for name, g, w in zip(("out", "dq", "dk", "dv"), (got_o, *got), (want_o, *want)):
    assert g.dtype == jnp.float32 and g.shape == w.shape
    assert_close(g, w, rel=2e-6, name=name)


def test_tiled_reference_float64_matches_autodiff():
  # MQA, not causal, Tq != Tk, Tq a multiple of block_q.
  q, k, v, do = _inputs(b=1, tq=40, tk=24, n=2, kh=1, d=32, seed=1)
  with jax.enable_x64(True):
    want_o, want = _autodiff_dense(*(x.astype(np.float64) for x in (q, k, v, do)), False)
  got_o, got = bench.exact_attention_vjp(q, k, v, do, is_causal=False, block_q=8)
  # The reference computes in FP64 and rounds once to FP32 on the way out: within FP32's half ulp.
  for name, g, w in zip(("out", "dq", "dk", "dv"), (got_o, *got), (want_o, *want)):
    assert g.dtype == jnp.float32 and g.shape == w.shape
    assert_close(g, w, rel=1e-7, name=name)


def test_bad_shapes_and_dtype_are_named():
  q = jnp.zeros((1, 8, 4, 16))
  k = jnp.zeros((1, 8, 3, 16))
  with pytest.raises(ValueError, match="key, value"):
    bench.exact_attention_vjp(q, k, k, q, is_causal=False)
  with pytest.raises(ValueError, match="d_out"):
    bench.exact_attention_vjp(q, q, q, q[:, :4], is_causal=False)
  with pytest.raises(ValueError, match="block_q"):
    bench.exact_attention_vjp(q, q, q, q, is_causal=False, block_q=0)
  with pytest.raises(ValueError, match="dtype"):
    bench.exact_attention_vjp(q, q, q, q, is_causal=False, dtype=jnp.bfloat16)


def test_cli_choices():
  args = bench.parse_args(
    ["--lengths", "64,128", "--p-scales", "row", "--smooth-k", "yes", "--qkv-scales", "block,tensor"]
  )
  assert args.lengths == [64, 128] and args.p_scales == ["row"] and args.smooth_k == [True]
  assert args.qkv_scales == ["block", "tensor"] and args.reference_dtype == "float64"
  for argv in (["--lengths", "0"], ["--p-scales", "rows"], ["--smooth-k", ""], ["--qkv-scales", "tensor,x"]):
    with pytest.raises(SystemExit, match=argv[0]):
      bench.parse_args(argv)


def test_plot_skips_rows_without_measurements(tmp_path):
  pytest.importorskip("matplotlib")
  mode = dict(heads=2, head_dim=64, smooth_k=False, qkv_scale="block")
  err = dict(err_o=0.1, err_dq=0.2, err_dk=0.2, err_dv=0.5, fwd_bwd_ms=1.0)
  rows = [dict(t=t, causal=c, p_scale="block", **mode, **err) for t in (64, 128) for c in (False, True)]
  rows.append(dict(t=64, causal=False, p_scale="row", **dict(mode, qkv_scale="tensor"), error="RuntimeError: no"))
  path = tmp_path / "n.png"
  bench._plot(rows, str(path))
  assert path.stat().st_size > 1000


def test_memory_accounting_matches_the_shapes():
  b, n, s, d = 2, 4, 48, 64
  e, r = b * s * n * d * 2, b * n * s * 4  # one bf16 [B, S, N, D] tensor, one f32 [B, N, S] statistic
  acct = attention_bench.memory_accounting(b, n, s, d)
  names = lambda kind: [t["name"] for t in acct[kind]]
  total = lambda kind: sum(t["bytes"] for t in acct[kind])
  assert names("inputs") == ["q", "k", "v"] and total("inputs") == 3 * e
  assert names("outputs") == ["loss", "dq", "dk", "dv"] and total("outputs") == 4 + 3 * e
  assert names("residuals") == ["o_hp", "lse"] and total("residuals") == e + r
  # Today's plans: fake-quantize scratch in the forward (fq(Q) too, causal), delta and the causal walk's NaN flags
  # (one int32 per KV head and 64-key tile) in the backward; the backward's fq(K), fq(V) live in dk's and dv's storage
  # and fq(Q) in O''s. A plan that drops or adds a buffer changes these lists, and the remedies printed with them.
  flags = b * n * -(-s // 64) * 4
  assert sorted(names("forward_transients")) == ["k_hat", "o", "q_hat", "v_hat"]
  assert total("forward_transients") == 4 * e
  assert sorted(names("backward_transients")) == ["delta", "dkdv_leaks", "do"]
  assert total("backward_transients") == e + r + flags
  assert [(t["name"], t["stored_in"]) for t in acct["backward_in_outputs"]] == [
      ("k_hat", "dk"), ("v_hat", "dv"), ("q_hat", "o_for_delta")]
  base, peak = 7 * e + r + 4, 8 * e + 2 * r + 4 + flags
  assert acct["base"] == base and acct["forward_peak"] == 8 * e + r and acct["backward_peak"] == peak
  assert acct["predicted_ratio"] == peak / base
  assert acct["predicted_ratio_with_cotangent"] == peak / (base + e)
  # Without dO the forward's peak (fq(Q), fq(K), fq(V) and O beside the inputs and residuals) is the larger one.
  assert "fq copies" not in acct["without"]
  assert acct["without"]["do"]["ratio"] == max(8 * e + r, 7 * e + 2 * r + 4 + flags) / base
  row = attention_bench.memory_accounting(b, n, s, d, p_scale="row")
  assert [t["name"] for t in row["residuals"]] == ["o_hp", "lse", "row_max"] and row["base"] == base + r


def test_memory_accounting_at_the_issue_shape():
  """At issue 13's shape the plans predict 1.145x of inputs + outputs + residuals with dO counted as a transient
  (1.002x counting it as an input): within the 1.2x budget either way."""
  acct = attention_bench.memory_accounting(*attention_bench.MEMORY_SHAPE)
  assert 1.14 < acct["predicted_ratio"] < 1.15 <= attention_bench.MEMORY_BUDGET
  assert 1.0 < acct["predicted_ratio_with_cotangent"] < 1.01
  text = "\n".join(attention_bench.format_accounting(acct))
  assert "1.145x" in text and "q_hat    lives in o_for_delta's storage" in text and "lives in dk's storage" in text


@pytest.mark.gpu
def test_tiled_reference_float64_on_gpu_matches_autodiff():
  """The benchmark's FP64 path on the GPU (cuBLAS DGEMM under a local x64), against FP32 autodiff of jax.nn."""
  q, k, v, do = _inputs(b=1, tq=1000, tk=1000, n=4, kh=2, d=128, seed=5)
  with jax.default_matmul_precision("highest"):  # no TF32 in the oracle
    want_o, want = _autodiff(q, k, v, do, True)
  got_o, got = bench.exact_attention_vjp(q, k, v, do, is_causal=True, block_q=256)
  # FP32 rows of 1000 terms: ~1e-6 relative on the CPU (measured); 1e-5 leaves the GPU's exp, log and
  # summation orders room, while a wrong block, mask or delta costs O(1).
  for name, g, w in zip(("out", "dq", "dk", "dv"), (got_o, *got), (want_o, *want)):
    assert_close(g, w, rel=1e-5, name=name)


@pytest.mark.gpu
def test_memory_check_peak_covers_the_plans_backward(tmp_path):
  """``--memory-only`` in its own process (``peak_bytes_in_use`` is a process high-water mark)."""
  out = tmp_path / "memory.json"
  proc = subprocess.run(
    [sys.executable, os.path.join(BENCH, "attention.py"), "--memory-only", "--memory-shape", "1,8,16384,128"]
    + ["--out", str(out)],
    env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  m = json.loads(out.read_text())["memory_check"]
  assert m["finite"], "non-finite loss or gradients"
  # Every buffer of the predicted backward peak is live during the dK/dV launch (parameters, the residuals,
  # dO, the fq copies, delta, dq done, dk and dv being written; no aliasing), so the measured high-water mark
  # cannot be lower: if it is, the accounting lists a buffer that does not exist.
  assert m["peak_bytes"] >= m["accounting"]["backward_peak"], proc.stdout[-3000:]
