"""Property tests (hypothesis) of QAT attention on the XLA path: random shapes, dtypes, masks and options.

Two kinds of property, each against something independent of the implementation:
- the float64 re-derivation of docs/NUMERICS.md, sections 4-5 (tests/oracle.py) with the element-by-element
  mask oracle, within the bounds of tests/test_attention_reference.py;
- invariants: permuting the batch (with its masks) or the query heads within their KV group
  permutes the outputs, and nothing else changes. Both sides are the same compiled program
  on permuted data, compared up to summation order (``assert_reordered_equal``).
"""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import assert_close, assert_reordered_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import attention_grad_oracle, attention_oracle, visible_oracle

import jqat

OUT_BOUND = 2 * 2.0**-9  # as in tests/test_attention_reference.py, with its reasons
LSE_BOUND = 1e-5
DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


@st.composite
def cases(draw):
  b = draw(st.integers(1, 2))
  tq, tk = draw(st.integers(1, 24)), draw(st.integers(1, 24))
  kh = draw(st.integers(1, 2))
  n = kh * draw(st.integers(1, 2))
  d = draw(st.sampled_from([16, 32]))
  kw = dict(is_causal=draw(st.booleans()), block_n=draw(st.sampled_from([16, 32])),
            quantize_qkv=draw(st.booleans()), quantize_p=draw(st.booleans()))
  if draw(st.booleans()):
    kw["local_window_size"] = (draw(st.integers(0, 8)), draw(st.integers(0, 8)))
  if draw(st.booleans()):
    kw["causal_alignment"] = "bottom_right"
  if draw(st.booleans()):
    kw["query_seq_lengths"] = np.array([draw(st.integers(0, tq)) for _ in range(b)], np.int32)
    kw["key_value_seq_lengths"] = np.array([draw(st.integers(0, tk)) for _ in range(b)], np.int32)
  if draw(st.booleans()):
    kw["q_segment_ids"] = np.sort(np.array([[draw(st.integers(0, 2)) for _ in range(tq)] for _ in range(b)], np.int32))
    kw["kv_segment_ids"] = np.sort(np.array([[draw(st.integers(0, 2)) for _ in range(tk)] for _ in range(b)], np.int32))
  return (b, tq, tk, n, kh, d), draw(st.sampled_from(sorted(DTYPES))), draw(st.integers(0, 2**16)), kw


def _inputs(shape, dtype, seed):
  b, tq, tk, n, kh, d = shape
  ks = jax.random.split(jax.random.key(seed), 4)
  mk = lambda key, s: jax.random.normal(key, s, jnp.float32).astype(DTYPES[dtype])
  return mk(ks[0], (b, tq, n, d)), mk(ks[1], (b, tk, kh, d)), mk(ks[2], (b, tk, kh, d)), mk(ks[3], (b, tq, n, d))


def _vis(shape, kw):
  b, tq, tk = shape[:3]
  return visible_oracle(b, tq, tk, is_causal=kw["is_causal"], q_len=kw.get("query_seq_lengths"),
                        kv_len=kw.get("key_value_seq_lengths"), q_seg=kw.get("q_segment_ids"),
                        kv_seg=kw.get("kv_segment_ids"), window=kw.get("local_window_size"),
                        bottom_right=kw.get("causal_alignment") == "bottom_right")


def _masks(kw):
  return {k: jnp.asarray(v) for k, v in kw.items() if isinstance(v, np.ndarray)}


def _static(kw):
  return {k: v for k, v in kw.items() if not isinstance(v, np.ndarray) and k not in ("quantize_qkv", "quantize_p")}


_SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(case=cases())
def test_random_cases_match_float64(case):
  shape, dtype, seed, kw = case
  q, k, v, do = _inputs(shape, dtype, seed)
  scale = shape[-1] ** -0.5
  config = jqat.QATConfig(kw["quantize_qkv"], kw["quantize_p"])
  bwd_static = {k_: v_ for k_, v_ in _static(kw).items() if k_ != "block_n"}

  def run(q, k, v, do, masks):  # one program per example (CI time: each example's shapes compile anew)
    out, out_hp, lse = jqat.attention_forward(q, k, v, implementation="xla", config=config, **_static(kw), **masks)
    grads = jqat.attention_backward(do, q, k, v, out_hp, lse, implementation="xla", config=config, **bwd_static,
                                    **masks)
    return out, out_hp, lse, grads

  out, out_hp, lse, grads = jax.jit(run)(q, k, v, do, _masks(kw))
  vis = _vis(shape, kw)
  want_o, want_ohp, want_lse = attention_oracle(q, k, v, scale=scale, is_causal=kw["is_causal"],
                                                block_n=kw["block_n"], quantize_qkv=kw["quantize_qkv"],
                                                quantize_p=kw["quantize_p"], vis=vis)
  assert_close(out, want_o, rel=OUT_BOUND, name="O")
  assert_close(out_hp, want_ohp, rel=OUT_BOUND, name="O'")
  finite = np.isfinite(want_lse)
  assert (np.isneginf(np.asarray(lse)) == ~finite).all(), "rows without visible keys must have lse = -inf"
  assert_close(np.where(finite, lse, 0), np.where(finite, want_lse, 0), rel=LSE_BOUND, name="lse")
  want = attention_grad_oracle(do, q, k, v, out_hp, lse, scale=scale, is_causal=kw["is_causal"],
                               quantize_qkv=kw["quantize_qkv"], vis=vis)
  for name, g, w in zip(("dQ", "dK", "dV"), grads, want):
    if np.abs(w).max(initial=0.0) == 0:
      # Exactly zero in exact arithmetic (every row masked, or one visible key: dS = dP - delta = 0);
      # FP32 leaves reduction noise of a few ulps of the D-term sums behind (inputs ~N(0, 1)).
      assert np.abs(np.asarray(g, np.float32)).max() <= 1e-6 * shape[-1], name
    else:
      assert_close(g, w, rel=OUT_BOUND, name=name)


@_SETTINGS
@given(case=cases(), perm_seed=st.integers(0, 2**16))
def test_permuting_batch_and_heads_permutes_outputs(case, perm_seed):
  shape, dtype, seed, kw = case
  b, _, _, n, kh, _ = shape
  q, k, v, _ = _inputs(shape, dtype, seed)
  rng = np.random.default_rng(perm_seed)
  pb = rng.permutation(b)
  g = n // kh  # query heads permute within their KV group, or they would read other keys
  ph = np.concatenate([grp * g + rng.permutation(g) for grp in range(kh)])
  run = jax.jit(lambda q, k, v, m: jqat.attention_forward(q, k, v, implementation="xla", **_static(kw), **m,
                                                          config=jqat.QATConfig(kw["quantize_qkv"], kw["quantize_p"])))
  masks = _masks(kw)
  base = run(q, k, v, masks)
  perm = run(q[pb][:, :, ph], k[pb], v[pb], {name: m[pb] for name, m in masks.items()})
  for name, x, y in zip(("O", "O'"), base, perm):
    assert_reordered_equal(y, x[pb][:, :, ph], name=name)
  assert_reordered_equal(perm[2], base[2][pb][:, ph], name="lse")
