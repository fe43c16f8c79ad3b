"""Masks (padding lengths, segment ids, sliding windows, bottom-right causal) on every implementation.

The oracle's visibility (``oracle.visible_oracle``) is written element by element from the rule in
``jqat.attention``'s docstring, with no code shared with the reference's ``visible``. The XLA reference (and
jqat.torch, which runs it on the CPU) is held to a float64 oracle with the bounds of tests/test_attention_reference.py
(OUT_BOUND: BF16 storage plus one E2M1 flip; LSE_BOUND: FP32 only); the Triton kernels to the reference on the same
inputs with the bounds of tests/test_attention_triton.py (exp2 vs exp last-bit differences).
"""

import jax.numpy as jnp
import numpy as np
import pytest
from cases import KERNEL_BOUNDS, KERNELS, Masks, implementations, mask_set, qkv, run, zero_empty_rows
from conftest import assert_close
from oracle import attention_grad_oracle, attention_oracle

import jqat
from jqat.kernels_triton.attention_bwd import BackwardConfig

OUT_BOUND = 2 * 2.0**-9
LSE_BOUND = 1e-5

B, TQ, TK, N, K, D = 2, 37, 45, 4, 2, 16


def _masks(spec, tq=TQ, tk=TK) -> Masks:
  causal, window, br, with_lengths, with_segments = spec
  q_len, kv_len, q_seg, kv_seg = mask_set(B, tq, tk, unsorted=with_segments == 2)
  return Masks(is_causal=causal, window=window, bottom_right=br, q_len=q_len if with_lengths else None,
               kv_len=kv_len if with_lengths else None, q_seg=q_seg if with_segments else None,
               kv_seg=kv_seg if with_segments else None)


def _inputs(tq, tk, seed, d=D, heads=(N, K)):
  return qkv((B, tq, tk, *heads, d), seed)


# Each mask alone and in combination: (is_causal, window, bottom_right, lengths, segments); segments 2: unsorted.
MASKS = {
    "lengths": (False, None, False, True, False),
    "segments": (False, None, False, False, True),
    "segments-unsorted": (False, None, False, False, 2),
    "window": (False, (7, 3), False, False, False),
    "window-left-only-causal": (True, (9, 0), False, False, False),
    "causal-bottom-right": (True, None, True, False, False),
    "window-bottom-right": (False, (4, 2), True, False, False),
    "causal-lengths-segments": (True, None, False, True, True),
    "all": (True, (11, 5), True, True, True),
}
# Tq, Tk straddle the 16-row / 16- and 32-key tiles so every tile kind (skipped, masked, unmasked) occurs. In the
# interpreter (seconds a case) lengths alone, sorted segments alone and the causal left-only window are left out:
# the combinations ("all" holds a window and the causal mask) and test_numerics_modes' "lengths" and
# "segments-empty-rows" cases cover them; the compiled kernels run every case. jqat.torch (on the CPU the XLA
# reference once more) runs the combination of all masks.
NOT_INTERPRETED = ("lengths", "segments", "window-left-only-causal")


def _params():
  for name, tq, tk in [(name, TQ, TK) for name in MASKS] + [("all", TK, TQ), ("causal-bottom-right", TK, TQ)]:
    interpreted = name == "all" or (name not in NOT_INTERPRETED and (tq, tk) == (TQ, TK))
    impls = ["xla", "triton"] + ["interpreter"] * interpreted + ["torch"] * (name == "all" and tq == TQ)
    for impl in implementations(*impls, slow=("interpreter",)):
      yield pytest.param(impl.values[0], name, tq, tk, marks=impl.marks, id=f"{name}-{tq}x{tk}-{impl.id}")


def _check(implementation, masks, tq, tk, d, seed, bwd=None, heads=(N, K)):
  """One case on ``implementation``: against the float64 oracle (the reference, jqat.torch) or the reference (the
  kernels); empty rows (no visible key) give lse = -inf, O = 0 and dQ = 0 exactly everywhere."""
  q, k, v, do = _inputs(tq, tk, seed, d, heads)
  kw = {} if bwd is None else dict(bwd=bwd)
  got = run(implementation, q, k, v, do, masks, **kw)
  vis = masks.visible(B, tq, tk)
  empty = ~vis.any(-1)  # [B, Tq]
  if "lse" in got:
    assert (np.isneginf(got["lse"]) == empty[:, None, :]).all(), "lse = -inf exactly on empty rows"
  for key in ("O", "O'", "dQ"):
    if key in got:
      assert (got[key][empty] == 0).all(), f"{key} = 0 on empty rows"
  for key, x in got.items():
    assert not np.isnan(x).any(), key
  if implementation in KERNELS:
    ref = run("xla", q, k, v, do, masks)
    zero_empty_rows(got, ref)
    for key, x in got.items():
      assert_close(x, ref[key], rel=KERNEL_BOUNDS[key], name=key)
    return
  scale = d**-0.5
  r_o, r_ohp, r_lse = attention_oracle(q, k, v, scale=scale, is_causal=None, block_n=16, vis=vis)
  want = dict(zip(("O", "O'", "lse"), (r_o, r_ohp, r_lse)))
  o_hp, lse = got.get("O'", r_ohp), got.get("lse", r_lse)
  want.update(zip(("dQ", "dK", "dV"), attention_grad_oracle(do, q, k, v, o_hp, lse, scale=scale, is_causal=None,
                                                            vis=vis)))
  zero_empty_rows(got, want)
  for key, x in got.items():
    assert_close(x, want[key], rel=LSE_BOUND if key == "lse" else OUT_BOUND, name=key)


@pytest.mark.parametrize("implementation,name,tq,tk", list(_params()))
def test_masks_match_oracle_or_reference(implementation, name, tq, tk):
  _check(implementation, _masks(MASKS[name], tq, tk), tq, tk, D, seed=len(name) + tq)


# d = 80 (D_PAD 128, five fq blocks) repeats d = 48's code path at about twice the interpreter's time: GPU only.
@pytest.mark.parametrize("implementation", implementations("interpreter", "triton", slow=("interpreter",)))
@pytest.mark.parametrize("d", [48, pytest.param(80, marks=pytest.mark.gpu)])
def test_padded_head_dims(implementation, d):
  """D not a power of two: tiles padded to D_PAD with masked loads; fq blocks of 16 along D unchanged."""
  _check(implementation, _masks(MASKS["causal-lengths-segments"], 33, 40), 33, 40, d, seed=d, heads=(2, 1))


@pytest.mark.parametrize("implementation", implementations("interpreter", "triton", slow=("interpreter",)))
def test_window_skips_tiles_with_the_same_result(implementation):
  """A window narrower than a tile with long sequences: most tiles are skipped (forward, dQ, dK/dV)."""
  _check(implementation, Masks(window=(3, 2)), 80, 96, D, seed=7, bwd=BackwardConfig(16, 16, 4, 1, 16, 16, 4, 1),
         heads=(1, 1))


def test_masked_keys_leave_the_fq_block_amax():
  """A huge hidden key shares a 16-key fq(P) block with visible ones; hiding it by any mask gives the result
  of the attention without that key (the amax is over visible keys only)."""
  q, k, v, _ = _inputs(16, 16, seed=3, d=32)
  k = k.at[:, 5].set(30.0)  # logit far above the rest: its P would set the block scale
  sub = lambda a: a[:, :5]
  want = jqat.attention(sub(q), sub(k), sub(v), implementation="xla")
  lens = jnp.array([5, 5], jnp.int32)
  for kw in (dict(key_value_seq_lengths=lens, query_seq_lengths=lens),
             dict(q_segment_ids=(jnp.arange(16) >= 5).astype(jnp.int32)[None].repeat(2, 0),
                  kv_segment_ids=(jnp.arange(16) >= 5).astype(jnp.int32)[None].repeat(2, 0))):
    got = jqat.attention(q, k, v, implementation="xla", **kw)
    np.testing.assert_array_equal(np.asarray(sub(got)), np.asarray(want))


@pytest.mark.parametrize("kw,match", [
    (dict(query_seq_lengths=np.zeros((3,), np.int32)), r"query_seq_lengths must have shape \(2,\)"),
    (dict(key_value_seq_lengths=np.zeros((2,), np.float32)), "key_value_seq_lengths must have an integer dtype"),
    (dict(q_segment_ids=np.zeros((2, 16), np.int32)), "must be given together"),
    (dict(q_segment_ids=np.zeros((2, 8), np.int32), kv_segment_ids=np.zeros((2, 8), np.int32)),
     r"q_segment_ids must have shape \(2, 16\)"),
    (dict(local_window_size=-1), "local_window_size must be a non-negative int"),
    (dict(local_window_size=(1, 2, 3)), "local_window_size must be None, a non-negative int or a pair"),
    (dict(local_window_size=(1, True)), r"local_window_size\[1\] \(right\)"),
    (dict(causal_alignment="bottom-right"), "causal_alignment must be one of"),
])
def test_bad_masks_raise_naming_the_argument(kw, match):
  q, k, v, _ = _inputs(16, 16, seed=0, d=32)
  with pytest.raises((TypeError, ValueError), match=match):
    jqat.attention(q, k, v, implementation="xla", **kw)


def test_int_window_is_symmetric_as_in_jax():
  q, k, v, _ = _inputs(24, 24, seed=1, d=32)
  a = jqat.attention(q, k, v, implementation="xla", local_window_size=3)
  b = jqat.attention(q, k, v, implementation="xla", local_window_size=(3, 3))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
