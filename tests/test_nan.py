"""NaN is never hidden and never spreads: exact NaN positions of the forward and backward (docs/NUMERICS.md, section 5).

The expected positions come from tests/oracle.py's boolean dependency oracles, not from
running the implementation. Parametrized over implementations: the XLA reference, the Triton
kernels compiled on a GPU (``triton``, through the JAX API) and, on a CPU machine, the same kernels
in Triton's interpreter (``interpreter``, through the torch binding's launcher on CPU tensors).
"""

import functools
import os

from conftest import HAS_GPU  # noqa: E402

os.environ.setdefault("TRITON_INTERPRET", "0" if HAS_GPU else "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from oracle import attention_grad_nan_oracle, attention_nan_oracle, visible_oracle  # noqa: E402

import jqat  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
IMPLEMENTATIONS = ["xla", pytest.param("triton", marks=pytest.mark.gpu)]
# Every implementation is exact: a masked pair contributes exactly nothing (the kernels walk a program's tiles
# again, NaN-exactly, when a NaN reached its results; docs/NUMERICS.md).
EXACT = {"xla": True, "triton": True, "interpreter": True}
SHAPE = (1, 40, 37, 2, 1, 32)  # (B, Tq, Tk, N, K, D): GQA, a partial key tile, two D blocks


def _inputs(shape, seed=0):
  b, tq, tk, n, kh, d = shape
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (b, tq, n, d), jnp.float32).astype(jnp.bfloat16)
  k = jax.random.normal(ks[1], (b, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  v = jax.random.normal(ks[2], (b, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  do = jax.random.normal(ks[3], (b, tq, n, d), jnp.float32).astype(jnp.bfloat16)
  return q, k, v, do


@functools.cache
def _chain(implementation, is_causal):
  """jit(forward outputs and jax.grad of sum(attention * dO))."""
  kw = {"is_causal": is_causal, "implementation": implementation}

  def run(q, k, v, do):
    loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, **kw).astype(jnp.float32) * do.astype(jnp.float32))
    return jqat.attention_forward(q, k, v, **kw), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  return jax.jit(run)


@functools.cache
def _backward(implementation, is_causal):
  return jax.jit(functools.partial(jqat.attention_backward, is_causal=is_causal, implementation=implementation))


def _poison(x, index):
  return x.at[index].set(jnp.nan)


def _assert_nan_at(actual, expected, name, exact=True):
  got = np.isnan(np.asarray(actual, np.float32))
  expected = np.asarray(expected, bool)
  assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
  missing, extra = int((expected & ~got).sum()), int((got & ~expected).sum())
  assert not missing, f"{name}: {missing} NaN hidden"
  assert not exact or not extra, f"{name}: {extra} NaN where none is due"


def _check_chain(implementation, is_causal, q, k, v, do):
  (o, o_hp, lse), (dq, dk, dv) = _chain(implementation, is_causal)(q, k, v, do)
  nan = lambda x: np.isnan(np.asarray(x, np.float32))
  o_nan, lse_nan = attention_nan_oracle(nan(q), nan(k), nan(v), is_causal=is_causal)
  exact = EXACT[implementation]
  for name, x in (("O", o), ("O'", o_hp)):
    _assert_nan_at(x, o_nan, name, exact)
  _assert_nan_at(lse, lse_nan, "lse", exact)
  want = attention_grad_nan_oracle(nan(do), nan(q), nan(k), nan(v), o_nan, lse_nan, is_causal=is_causal)
  for name, x, w in zip(("dQ", "dK", "dV"), (dq, dk, dv), want):
    _assert_nan_at(x, w, name, exact)
  return o_nan, want


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("where", ["q", "k", "v", "do"])
def test_one_nan_input_reaches_exactly_its_dependents(implementation, is_causal, where):
  q, k, v, do = _inputs(SHAPE)
  # Mid-sequence positions: under causal masking rows before them must stay finite.
  index = {"q": (0, 21, 1, 17), "k": (0, 21, 0, 3), "v": (0, 9, 0, 20), "do": (0, 7, 0, 30)}[where]
  args = {"q": q, "k": k, "v": v, "do": do}
  args[where] = _poison(args[where], index)
  _, (dq_nan, _, dv_nan) = _check_chain(implementation, is_causal, **args)
  # The oracle itself must see the NaN (a NaN that reaches nothing would test nothing).
  assert dq_nan.any() and dv_nan.any() == (where != "v")  # dV = fq(P)^T dO does not read V
  if is_causal:  # and containment must be visible: the first rows never see key/row 21
    assert not dq_nan[:, :7].any()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("where", ["lse", "out_for_delta"])
def test_nan_lse_or_o_prime_reaches_the_backward(implementation, is_causal, where):
  """Explicit backward: a NaN lse row makes that row's P NaN (only -inf means "sees nothing");
  a NaN in O' makes its row's delta NaN."""
  q, k, v, do = _inputs(SHAPE, seed=1)
  _, o_hp, lse = jqat.attention_forward(q, k, v, is_causal=is_causal, implementation=implementation)
  row = 12
  if where == "lse":
    lse = lse.at[0, 1, row].set(jnp.nan)
  else:
    o_hp = o_hp.at[0, row, 1, 5].set(jnp.nan)
  dq, dk, dv = _backward(implementation, is_causal)(do, q, k, v, o_hp, lse)
  nan = lambda x: np.isnan(np.asarray(x, np.float32))
  want = attention_grad_nan_oracle(nan(do), nan(q), nan(k), nan(v), nan(o_hp), nan(lse), is_causal=is_causal)
  for name, x, w in zip(("dQ", "dK", "dV"), (dq, dk, dv), want):
    _assert_nan_at(x, w, name, EXACT[implementation])
  assert want[0][0, row, 1].all() and not want[0][0, row, 0].any()  # one query head's row only
  # NaN P reaches dV through fq(P)'s blocks of 16 keys; delta does not enter dV.
  assert want[2].any() == (where == "lse")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_random_nan_placement(implementation, data):
  is_causal = data.draw(st.booleans(), label="is_causal")
  shape = data.draw(st.sampled_from([(1, 24, 19, 2, 2, 16), (2, 9, 33, 2, 1, 32)]), label="shape")
  q, k, v, do = _inputs(shape, seed=data.draw(st.integers(0, 3), label="seed"))
  args = {"q": q, "k": k, "v": v, "do": do}
  for name in data.draw(st.lists(st.sampled_from(sorted(args)), min_size=1, max_size=3), label="poisoned"):
    x = args[name]
    index = tuple(data.draw(st.integers(0, size - 1), label=f"{name} index") for size in x.shape)
    args[name] = _poison(x, index)
  _check_chain(implementation, is_causal, **args)


# ----------------------------------------------------------------------------- masks: segments, windows, lengths


MASK_IMPLEMENTATIONS = ["xla", pytest.param("triton", marks=pytest.mark.gpu),
                        pytest.param("interpreter", marks=pytest.mark.skipif(not INTERPRET,
                                                                             reason="the interpreter runs on CPU"))]
_SEG = np.array([[0] * 40 + [1] * 88], np.int32)  # two packed documents (issue 43)
# name: (shape (B, Tq, Tk, N, K, D), keywords, {input: poisoned index}); each poisoned alone.
MASK_CASES = {
    "segments": ((1, 128, 128, 2, 1, 32), dict(q_segment_ids=_SEG, kv_segment_ids=_SEG),
                 {"v": (0, 60, 0, 3), "k": (0, 70, 0, 20), "q": (0, 45, 1, 9), "do": (0, 100, 0, 1)}),
    "segments_causal": ((1, 128, 128, 2, 1, 32), dict(q_segment_ids=_SEG, kv_segment_ids=_SEG, is_causal=True),
                        {"v": (0, 41, 0, 3), "k": (0, 44, 0, 20), "do": (0, 42, 1, 7)}),
    "window": ((1, 96, 96, 2, 1, 32), dict(local_window_size=(2, 2)),
               {"v": (0, 30, 0, 5), "k": (0, 50, 0, 17), "q": (0, 70, 0, 2), "do": (0, 12, 1, 30)}),
    "lengths": ((1, 40, 72, 2, 1, 32), dict(query_seq_lengths=np.array([2], np.int32),
                                            key_value_seq_lengths=np.array([50], np.int32)),
                {"do": (0, 3, 0, 4), "q": (0, 5, 1, 0), "v": (0, 60, 0, 8), "k": (0, 66, 0, 1)}),
    "lengths_causal_bottom_right": ((2, 24, 80, 2, 2, 32),
                                    dict(query_seq_lengths=np.array([24, 9], np.int32),
                                         key_value_seq_lengths=np.array([70, 80], np.int32), is_causal=True,
                                         causal_alignment="bottom_right"),
                                    {"do": (1, 15, 0, 4), "v": (0, 75, 1, 8), "q": (1, 20, 1, 3)}),
}


def _visibility(shape, kw):
  b, tq, tk = shape[:3]
  q_len, kv_len = kw.get("query_seq_lengths"), kw.get("key_value_seq_lengths")
  return visible_oracle(b, tq, tk, is_causal=kw.get("is_causal", False), q_len=q_len, kv_len=kv_len,
                        q_seg=kw.get("q_segment_ids"), kv_seg=kw.get("kv_segment_ids"),
                        window=kw.get("local_window_size"),
                        bottom_right=kw.get("causal_alignment") == "bottom_right")


MODES = {"block": {}, "row": dict(p_scale="row"), "tensor": dict(qkv_scale="tensor"),
         "no-fq-p": dict(quantize_p=False, quantize_p_backward=False)}


@functools.cache
def _masked_chain(implementation, case, mode="block"):
  kw = dict(MASK_CASES[case][1], implementation=implementation, **MODES[mode])

  def run(q, k, v, do):
    loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, **kw).astype(jnp.float32) * do.astype(jnp.float32))
    fkw = {n: x for n, x in kw.items() if not n.startswith("quantize_p")}
    cfg = jqat.QATConfig(quantize_p=kw.get("quantize_p", True), quantize_p_backward=kw.get("quantize_p_backward",
                                                                                           True))
    return jqat.attention_forward(q, k, v, config=cfg, **fkw)[:3], jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  return jax.jit(run)


def _interpreted_chain(case, q, k, v, do, mode="block"):
  """The forward and backward kernels in Triton's interpreter, launched by the torch binding on CPU tensors."""
  import torch

  from jqat._src import validate
  from jqat.torch import _attention as ta

  kw = MASK_CASES[case][1]
  mkw = MODES[mode]
  to_bhsd = lambda x: torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).transpose(1, 2).contiguous()
  qt, kt, vt, dot = map(to_bhsd, (q, k, v, do))
  masks = tuple(None if kw.get(name) is None else torch.from_numpy(np.asarray(kw[name], np.int32))
                for name in validate.MASK_NAMES)
  cfg = jqat.QATConfig(quantize_p=mkw.get("quantize_p", True), quantize_p_backward=mkw.get("quantize_p_backward", True))
  opts = validate.attention_options(scale=None, is_causal=kw.get("is_causal", False),
                                    block_n=jqat.DEFAULT_BLOCK_N, head_dim=q.shape[-1], config=cfg,
                                    local_window_size=kw.get("local_window_size"),
                                    causal_alignment=kw.get("causal_alignment", "top_left"),
                                    p_scale=mkw.get("p_scale", "block"),
                                    qkv_scale=mkw.get("qkv_scale", "block"))
  o, o_hp = torch.empty_like(qt), torch.empty_like(qt)
  lse = torch.empty(qt.shape[:3], dtype=torch.float32)
  row_max = torch.empty_like(lse) if opts.p_scale == "row" else None
  ta.forward_kernels(qt, kt, vt, o, o_hp, lse, opts, masks, row_max=row_max)
  grads = ta.backward_kernels(dot, qt, kt, vt, o_hp, lse, opts, masks=masks, row_max=row_max)
  to_btnh = lambda x: x.float().transpose(1, 2).numpy()
  return (to_btnh(o), to_btnh(o_hp), lse.numpy()), tuple(map(to_btnh, grads))


_MASK_PARAMS = ([(c, w, "block") for c, spec in MASK_CASES.items() for w in spec[2]]
                + [("window", w, m) for m in ("row", "tensor", "no-fq-p") for w in ("v", "q")]
                + [("lengths", "do", m) for m in ("row", "tensor", "no-fq-p")])
# The interpreter takes about 15 s a case on CI's cores: there, the three cases of the issue (documents, a window,
# a padded row's cotangent); the XLA reference and the compiled kernels (GPU) run every case, every numerics mode.
_INTERPRETED = {("segments", "v", "block"), ("window", "v", "block"), ("lengths", "do", "block")}


def _mask_params():
  for impl in MASK_IMPLEMENTATIONS:
    name, marks = (impl, ()) if isinstance(impl, str) else (impl.values[0], impl.marks)
    for case in _MASK_PARAMS:
      if name != "interpreter" or case in _INTERPRETED:
        yield pytest.param(name, *case, marks=marks, id=f"{'-'.join(case)}-{name}")


@pytest.mark.parametrize("implementation, case, where, mode", list(_mask_params()))
def test_nan_at_masked_pairs_reaches_only_its_dependents(implementation, case, where, mode):
  """Packed documents, windows, padding lengths (padded rows and keys included): a NaN reaches exactly the outputs
  that depend on it through visible pairs. The kernels spread it through masked pairs before (issue 43): with two
  documents (ids 0 x40, 1 x88) a NaN in V of document 1 made rows of document 0 NaN; a window (2, 2) let one NaN
  reach every row; with query_seq_lengths=[2] a NaN cotangent at padded row 3 made all of dK and dV NaN."""
  shape, kw, poison = MASK_CASES[case]
  q, k, v, do = _inputs(shape, seed=3)
  args = {"q": q, "k": k, "v": v, "do": do}
  clean = dict(args)
  args[where] = _poison(args[where], poison[where])
  run = ((lambda *a: _interpreted_chain(case, *a, mode=mode)) if implementation == "interpreter"
         else _masked_chain(implementation, case, mode))
  (o, o_hp, lse), (dq, dk, dv) = run(*(args[n] for n in "q k v do".split()))
  (o0, o_hp0, lse0), (dq0, dk0, dv0) = run(*(clean[n] for n in "q k v do".split()))
  vis = _visibility(shape, kw)
  nan = lambda x: np.isnan(np.asarray(x, np.float32))
  o_nan, lse_nan = attention_nan_oracle(nan(args["q"]), nan(args["k"]), nan(args["v"]), is_causal=False, vis=vis)
  for name, x in (("O", o), ("O'", o_hp)):
    _assert_nan_at(x, o_nan, name)
  _assert_nan_at(lse, lse_nan, "lse")
  want = attention_grad_nan_oracle(nan(args["do"]), nan(args["q"]), nan(args["k"]), nan(args["v"]), o_nan, lse_nan,
                                   is_causal=False, vis=vis, quantize_p_backward=mode != "no-fq-p")
  for name, x, w in zip(("dQ", "dK", "dV"), (dq, dk, dv), want):
    _assert_nan_at(x, w, name)
  # Every output the NaN does not reach is the NaN-free run's, bit for bit (the poisoned element enters it only
  # through masked pairs, as an exact 0). Not with qkv_scale="tensor": there a NaN changes its (batch, head)'s
  # encode scale (docs/NUMERICS.md), hence every value of that head.
  for name, x, x0 in () if mode == "tensor" else zip(("O", "O'", "lse", "dQ", "dK", "dV"), (o, o_hp, lse, dq, dk, dv),
                         (o0, o_hp0, lse0, dq0, dk0, dv0)):
    x, x0 = np.asarray(x, np.float32), np.asarray(x0, np.float32)
    keep = ~np.isnan(x)
    assert (x[keep].view(np.uint32) == x0[keep].view(np.uint32)).all(), f"{name}: outputs without the NaN changed"
  # The case must test containment: some output stays finite although a product over the poisoned input's
  # masked pairs reaches it.
  assert not all(w.all() for w in want)
