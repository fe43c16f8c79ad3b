"""NaN is never hidden and never spreads: exact NaN positions of the forward and backward (docs/NUMERICS.md, section 5).

The expected positions come from tests/oracle.py's boolean dependency oracles, not from running the implementation.
Each case runs on the implementations of tests/cases.py: the XLA reference, the Triton kernels compiled on a GPU
(``triton``, through the JAX API), the same kernels in Triton's interpreter on a CPU machine (``interpreter``) and
jqat.torch (``torch``: O and the gradients).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cases import MODES, Masks, implementations, nan_of, poison, qkv, run
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import attention_grad_nan_oracle, attention_nan_oracle

import jqat

IMPLEMENTATIONS = implementations("xla", "triton")
# Every implementation is exact: a masked pair contributes exactly nothing (the kernels walk a program's tiles
# again, NaN-exactly, when a NaN reached its results; docs/NUMERICS.md).
EXACT = {"xla": True, "triton": True, "interpreter": True, "torch": True}
SHAPE = (1, 40, 37, 2, 1, 32)  # (B, Tq, Tk, N, K, D): GQA, a partial key tile, two D blocks


def _inputs(shape, seed=0):
  return qkv(shape, seed)


@functools.cache
def _backward(implementation, is_causal):
  return jax.jit(functools.partial(jqat.attention_backward, is_causal=is_causal, implementation=implementation))


def _assert_nan_at(actual, expected, name, exact=True):
  got = np.isnan(np.asarray(actual, np.float32))
  expected = np.asarray(expected, bool)
  assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
  missing, extra = int((expected & ~got).sum()), int((got & ~expected).sum())
  assert not missing, f"{name}: {missing} NaN hidden"
  assert not exact or not extra, f"{name}: {extra} NaN where none is due"


def _check_chain(implementation, is_causal, q, k, v, do):
  got = run(implementation, q, k, v, do, Masks(is_causal=is_causal), block_n=jqat.DEFAULT_BLOCK_N)
  nan = nan_of
  o_nan, lse_nan = attention_nan_oracle(nan(q), nan(k), nan(v), is_causal=is_causal)
  want = attention_grad_nan_oracle(nan(do), nan(q), nan(k), nan(v), o_nan, lse_nan, is_causal=is_causal)
  expected = dict(zip(("O", "O'", "lse", "dQ", "dK", "dV"), (o_nan, o_nan, lse_nan, *want)))
  for name, x in got.items():
    _assert_nan_at(x, expected[name], name, EXACT[implementation])
  return o_nan, want


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("where", ["q", "k", "v", "do"])
def test_one_nan_input_reaches_exactly_its_dependents(implementation, is_causal, where):
  q, k, v, do = _inputs(SHAPE)
  # Mid-sequence positions: under causal masking rows before them must stay finite.
  index = {"q": (0, 21, 1, 17), "k": (0, 21, 0, 3), "v": (0, 9, 0, 20), "do": (0, 7, 0, 30)}[where]
  args = {"q": q, "k": k, "v": v, "do": do}
  args[where] = poison(args[where], index)
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
  nan = nan_of
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
    args[name] = poison(x, index)
  _check_chain(implementation, is_causal, **args)


# ----------------------------------------------------------------------------- masks: segments, windows, lengths


_SEG = np.array([[0] * 40 + [1] * 88], np.int32)  # two packed documents (issue 43)
# name: (shape (B, Tq, Tk, N, K, D), masks, {input: poisoned index}); each poisoned alone.
MASK_CASES = {
    "segments": ((1, 128, 128, 2, 1, 32), Masks(q_seg=_SEG, kv_seg=_SEG),
                 {"v": (0, 60, 0, 3), "k": (0, 70, 0, 20), "q": (0, 45, 1, 9), "do": (0, 100, 0, 1)}),
    "segments_causal": ((1, 128, 128, 2, 1, 32), Masks(q_seg=_SEG, kv_seg=_SEG, is_causal=True),
                        {"v": (0, 41, 0, 3), "k": (0, 44, 0, 20), "do": (0, 42, 1, 7)}),
    "window": ((1, 96, 96, 2, 1, 32), Masks(window=(2, 2)),
               {"v": (0, 30, 0, 5), "k": (0, 50, 0, 17), "q": (0, 70, 0, 2), "do": (0, 12, 1, 30)}),
    "lengths": ((1, 40, 72, 2, 1, 32), Masks(q_len=np.array([2], np.int32), kv_len=np.array([50], np.int32)),
                {"do": (0, 3, 0, 4), "q": (0, 5, 1, 0), "v": (0, 60, 0, 8), "k": (0, 66, 0, 1)}),
    "lengths_causal_bottom_right": ((2, 24, 80, 2, 2, 32),
                                    Masks(q_len=np.array([24, 9], np.int32), kv_len=np.array([70, 80], np.int32),
                                          is_causal=True, bottom_right=True),
                                    {"do": (1, 15, 0, 4), "v": (0, 75, 1, 8), "q": (1, 20, 1, 3)}),
}


_MASK_PARAMS = ([(c, w, "block") for c, spec in MASK_CASES.items() for w in spec[2]]
                + [("window", w, m) for m in ("row", "tensor", "no-fq-p") for w in ("v", "q")]
                + [("lengths", "do", m) for m in ("row", "tensor", "no-fq-p")])
# The interpreter takes seconds a case on CI's cores: there (and through jqat.torch, which on the CPU runs the XLA
# reference once more), the three cases of the issue (documents, a window, a padded row's cotangent); the XLA
# reference and the compiled kernels (GPU) run every case, every numerics mode.
_INTERPRETED = {("segments", "v", "block"), ("window", "v", "block"), ("lengths", "do", "block")}


def _mask_params():
  for impl in implementations("xla", "triton", "interpreter", "torch", slow=("interpreter",)):
    for case in _MASK_PARAMS:
      if impl.values[0] in ("xla", "triton") or case in _INTERPRETED:
        yield pytest.param(impl.values[0], *case, marks=impl.marks, id=f"{'-'.join(case)}-{impl.id}")


@pytest.mark.parametrize("implementation, case, where, mode", list(_mask_params()))
def test_nan_at_masked_pairs_reaches_only_its_dependents(implementation, case, where, mode):
  """Packed documents, windows, padding lengths (padded rows and keys included): a NaN reaches exactly the outputs
  that depend on it through visible pairs. The kernels spread it through masked pairs before (issue 43): with two
  documents (ids 0 x40, 1 x88) a NaN in V of document 1 made rows of document 0 NaN; a window (2, 2) let one NaN
  reach every row; with query_seq_lengths=[2] a NaN cotangent at padded row 3 made all of dK and dV NaN."""
  shape, masks, poisoned = MASK_CASES[case]
  q, k, v, do = _inputs(shape, seed=3)
  args = {"q": q, "k": k, "v": v, "do": do}
  clean = dict(args)
  args[where] = poison(args[where], poisoned[where])
  # The bindings' default launch configurations (the tiles the spread of issue 43 crossed); at 128 rows and keys the
  # small test tiles would multiply the interpreter's programs.
  case_run = lambda a: run(implementation, *(a[n] for n in "q k v do".split()), masks, MODES[mode],
                           block_n=jqat.DEFAULT_BLOCK_N, fwd=None, bwd=None)
  got, got0 = case_run(args), case_run(clean)
  vis = masks.visible(*shape[:3])
  nan = nan_of
  o_nan, lse_nan = attention_nan_oracle(nan(args["q"]), nan(args["k"]), nan(args["v"]), is_causal=False, vis=vis)
  want = attention_grad_nan_oracle(nan(args["do"]), nan(args["q"]), nan(args["k"]), nan(args["v"]), o_nan, lse_nan,
                                   is_causal=False, vis=vis, quantize_p_backward=mode != "no-fq-p")
  # row_max (p_scale="row") depends on what lse depends on: the row's visible scores.
  expected = dict(zip(("O", "O'", "lse", "row_max", "dQ", "dK", "dV"), (o_nan, o_nan, lse_nan, lse_nan, *want)))
  for name, x in got.items():
    _assert_nan_at(x, expected[name], name)
  # Every output the NaN does not reach is the NaN-free run's, bit for bit (the poisoned element enters it only
  # through masked pairs, as an exact 0). Not with qkv_scale="tensor": there a NaN changes its (batch, head)'s
  # encode scale (docs/NUMERICS.md), hence every value of that head.
  for name in () if mode == "tensor" else got:
    x, x0 = np.asarray(got[name], np.float32), np.asarray(got0[name], np.float32)
    keep = ~np.isnan(x)
    assert (x[keep].view(np.uint32) == x0[keep].view(np.uint32)).all(), f"{name}: outputs without the NaN changed"
  # The case must test containment: some output stays finite although a product over the poisoned input's
  # masked pairs reaches it.
  assert not all(w.all() for w in want)


# ----------------------------------------------------------------------------- the warp-specialized causal walk


@pytest.mark.gpu
@pytest.mark.parametrize("where, d", [("q", 128), ("k", 128), ("v", 128), ("do", 128), ("k", 64), ("do", 64),
                                      ("k", 96), ("do", 96)])
def test_nan_through_the_warp_specialized_causal_walk_gpu(where, d):
  """With the bindings' default launch configurations a causal backward (Tk a multiple of 16, heads side by side)
  runs dK/dV on sm_90 as the warp-specialized kernel's causal walk; a key tile that a NaN reached there goes to the
  Triton kernel's exact walk (its REDO launch, on key tiles of 64 at D = 64 too). The NaN positions stay exact:
  96 query rows, 256 keys, top-left (keys past row 95 see none: the second program walks no tile; the NaN key is one
  of them), GQA."""
  shape = (1, 96, 256, 4, 2, d)
  args = dict(zip(("q", "k", "v", "do"), _inputs(shape, seed=3)))
  args[where] = poison(args[where], {"q": (0, 80, 1, 5), "k": (0, 150, 0, 7), "v": (0, 60, 1, 9),
                                     "do": (0, 40, 2, 3)}[where])
  got = run("triton", *args.values(), Masks(is_causal=True), block_n=jqat.DEFAULT_BLOCK_N, fwd=None, bwd=None)
  o_nan, lse_nan = attention_nan_oracle(*(nan_of(args[x]) for x in ("q", "k", "v")), is_causal=True)
  want = attention_grad_nan_oracle(nan_of(args["do"]), *(nan_of(args[x]) for x in ("q", "k", "v")), o_nan, lse_nan,
                                   is_causal=True)
  for name, expected in zip(("O", "lse", "dQ", "dK", "dV"), (o_nan, lse_nan, *want)):
    _assert_nan_at(got[name], expected, name)


@pytest.mark.gpu
@pytest.mark.parametrize("where, index, d, p_scale", [("q", (0, 80, 1, 5), 128, "block"),
                                                      ("k", (0, 150, 0, 7), 128, "block"),
                                                      ("k", (0, 70, 1, 7), 128, "block"),
                                                      ("v", (0, 60, 1, 9), 128, "block"),
                                                      ("v", (0, 70, 0, 9), 128, "block"),
                                                      ("v", (0, 70, 0, 9), 96, "block"),
                                                      ("v", (0, 70, 0, 9), 128, "row"),
                                                      ("k", (0, 70, 1, 7), 96, "row")])
def test_nan_through_the_warp_specialized_forward_gpu(monkeypatch, where, index, d, p_scale):
  """O alone (``jax.jit(jqat.attention)``, nothing differentiates) at D = 128 and 96 on sm_90 runs the warp-specialized
  forward's causal walk (``JQAT_ATTN_FWD_KERNEL=ws``: the default leaves walks this short to the Triton kernel); a
  64-row tile that a NaN reached there (e.g. V's key 70, hidden from rows 64-69 of its diagonal tile) goes to the Triton
  kernel's exact walk (its REDO launch). In row mode also the training forward (``jqat.attention_forward``: O, O', lse
  and the row max, all four written in place by the REDO launch). The NaN positions stay exact: 96 query rows, 256 keys,
  top-left (keys past row 95 are seen by none), GQA."""
  from jqat.ffi import jax_launch
  from jqat.ffi import plan as plans

  if tuple(jax_launch.target().compute_capability or ()) != (9, 0):
    pytest.skip("the warp-specialized forward is sm_90 code")
  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "ws")
  q, k, v, _ = _inputs((1, 96, 256, 4, 2, d), seed=4)
  args = {"q": q, "k": k, "v": v}
  args[where] = poison(args[where], index)
  o = jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=True, implementation="triton",
                                             p_scale=p_scale))(*args.values())
  o_nan, lse_nan = attention_nan_oracle(*(nan_of(args[x]) for x in ("q", "k", "v")), is_causal=True)
  _assert_nan_at(np.asarray(o, np.float32), o_nan, "O")
  if p_scale == "row":
    outs = jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, is_causal=True, implementation="triton",
                                                          p_scale=p_scale))(*args.values())
    for name, x, expected in zip(("O", "O'", "lse", "row_max"), outs, (o_nan, o_nan, lse_nan, lse_nan), strict=True):
      _assert_nan_at(np.asarray(x, np.float32), expected, name)
