"""Masks (padding lengths, segment ids, sliding windows, bottom-right causal) against a float64 oracle.

The oracle's visibility (``oracle.visible_oracle``) is written element by element from the rule in
``jqat.attention``'s docstring, with no code shared with the reference's ``visible``. Bounds are those of
tests/test_attention_reference.py (OUT_BOUND: BF16 storage plus one E2M1 flip; LSE_BOUND: FP32 only).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from oracle import attention_grad_oracle, attention_oracle, visible_oracle

import jqat

OUT_BOUND = 2 * 2.0**-9
LSE_BOUND = 1e-5

B, TQ, TK = 2, 37, 45


def _arrays(tq=TQ, tk=TK, unsorted=False):
  """Lengths and packed (sorted) segment ids with a segment no key has; ``unsorted``: ids out of order in
  batch element 1, which the kernels must not narrow by binary search."""
  q_len = np.array([tq, 20], np.int32)
  kv_len = np.array([30, tk], np.int32)
  q_seg = np.stack([np.repeat([0, 1, 2], [10, 15, tq - 25]), np.repeat([0, 1, 2], [5, 25, tq - 30])]).astype(np.int32)
  kv_seg = np.stack([np.repeat([0, 1, 3], [12, 20, tk - 32]), np.repeat([0, 1, 2], [5, 30, tk - 35])]).astype(np.int32)
  if unsorted:
    q_seg[1] = np.repeat([2, 0, 1, 2], [5, 10, 12, tq - 27])
    kv_seg[1] = np.repeat([1, 0, 2, 1], [4, 20, 7, tk - 31])
  return q_len, kv_len, q_seg, kv_seg


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


def _kw(spec, tq=TQ, tk=TK):
  causal, window, br, lengths, segments = spec
  q_len, kv_len, q_seg, kv_seg = _arrays(tq, tk, unsorted=segments == 2)
  kw = dict(is_causal=causal, local_window_size=window, causal_alignment="bottom_right" if br else "top_left")
  if lengths:
    kw.update(query_seq_lengths=jnp.asarray(q_len), key_value_seq_lengths=jnp.asarray(kv_len))
  if segments:
    kw.update(q_segment_ids=jnp.asarray(q_seg), kv_segment_ids=jnp.asarray(kv_seg))
  vis = visible_oracle(B, tq, tk, is_causal=causal, window=window, bottom_right=br,
                       q_len=q_len if lengths else None, kv_len=kv_len if lengths else None,
                       q_seg=q_seg if segments else None, kv_seg=kv_seg if segments else None)
  return kw, vis


def _inputs(tq, tk, seed, d=32, n=4, kh=2):
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (B, tq, n, d), jnp.float32).astype(jnp.bfloat16)
  k = jax.random.normal(ks[1], (B, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  v = jax.random.normal(ks[2], (B, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  do = jax.random.normal(ks[3], (B, tq, n, d), jnp.float32).astype(jnp.bfloat16)
  return q, k, v, do


@pytest.mark.parametrize("name,tq,tk", [(name, TQ, TK) for name in MASKS] + [("all", TK, TQ),
                                                                              ("causal-bottom-right", TK, TQ)])
def test_masks_forward_and_grads_match_float64(name, tq, tk):
  kw, vis = _kw(MASKS[name], tq, tk)
  q, k, v, do = _inputs(tq, tk, seed=len(name) + tq)
  scale = 32**-0.5
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, implementation="xla", block_n=16, **kw).astype(jnp.float32)
                                 * do.astype(jnp.float32))
  # One program for the forward outputs and the gradients (CI time: one compile per case, not two).
  (out, out_hp, lse), (dq, dk, dv) = jax.jit(lambda q, k, v: (
      jqat.attention_forward(q, k, v, implementation="xla", block_n=16, **kw),
      jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))(q, k, v)
  r_o, r_ohp, r_lse = attention_oracle(q, k, v, scale=scale, is_causal=None, block_n=16, vis=vis)
  assert_close(out, r_o, rel=OUT_BOUND, name="O")
  assert_close(out_hp, r_ohp, rel=OUT_BOUND, name="O'")
  empty = ~vis.any(-1)[:, None, :]  # [B, 1, Tq]: rows that see no key
  lse = np.asarray(lse)
  assert (np.isneginf(lse) == np.broadcast_to(empty, lse.shape)).all(), "lse = -inf exactly on empty rows"
  assert (np.asarray(out.astype(jnp.float32))[np.broadcast_to(empty.transpose(0, 2, 1)[..., None], out.shape)]
          == 0).all(), "O = 0 on empty rows"
  assert_close(np.where(np.isinf(lse), 0, lse), np.where(np.isinf(r_lse), 0, r_lse), rel=LSE_BOUND, name="lse")

  r_dq, r_dk, r_dv = attention_grad_oracle(do, q, k, v, out_hp, lse, scale=scale, is_causal=None, vis=vis)
  for got, want, nm in ((dq, r_dq, "dQ"), (dk, r_dk, "dK"), (dv, r_dv, "dV")):
    assert not np.isnan(np.asarray(got.astype(jnp.float32))).any(), nm
    assert_close(got, want, rel=OUT_BOUND, name=nm)
  dq = np.asarray(dq.astype(jnp.float32))
  assert (dq[np.broadcast_to(empty.transpose(0, 2, 1)[..., None], dq.shape)] == 0).all(), "dQ = 0 on empty rows"


def test_masked_keys_leave_the_fq_block_amax():
  """A huge hidden key shares a 16-key fq(P) block with visible ones; hiding it by any mask gives the result
  of the attention without that key (the amax is over visible keys only)."""
  q, k, v, _ = _inputs(16, 16, seed=3)
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
  q, k, v, _ = _inputs(16, 16, seed=0)
  with pytest.raises((TypeError, ValueError), match=match):
    jqat.attention(q, k, v, implementation="xla", **kw)


def test_int_window_is_symmetric_as_in_jax():
  q, k, v, _ = _inputs(24, 24, seed=1)
  a = jqat.attention(q, k, v, implementation="xla", local_window_size=3)
  b = jqat.attention(q, k, v, implementation="xla", local_window_size=(3, 3))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- Triton kernels

def _kernel_case(spec, tq, tk, d, seed, block_n=16, blocks=(16, 16, 16, 32)):
  """The forward and backward plans with masks, executed by the torch binding (the interpreter on CPU),
  against the reference on the same inputs; bounds and their reasons in tests/test_attention_triton.py."""
  # Imported here: test_attention_triton sets TRITON_INTERPRET before anything imports triton.
  import test_attention_triton as tat

  from jqat._src import attention_reference as reference
  from jqat.ffi import plan as plans
  from jqat.ffi import torch_launch
  from jqat.ffi.options import AttentionOptions, QATConfig
  from jqat.kernels_triton.attention_bwd import BackwardConfig
  from jqat.kernels_triton.attention_fwd import ForwardConfig

  torch = tat.torch
  device = tat.kernel_device()
  kw, _ = _kw(spec, tq, tk)
  q, k, v, do = _inputs(tq, tk, seed, d=d)
  opts = AttentionOptions(d**-0.5, kw["is_causal"], block_n, QATConfig(), kw["local_window_size"],
                          kw["causal_alignment"])
  names = ("query_seq_lengths", "key_value_seq_lengths", "q_segment_ids", "kv_segment_ids")
  masks_j = tuple(kw.get(n) for n in names)
  # Under jit, the forward and the backward it feeds as one program: one compile per case (eager dispatch
  # compiled ~140 programs).
  static = dict(scale=opts.scale, is_causal=opts.is_causal, cfg=opts.config, local_window_size=opts.local_window_size,
                causal_alignment=opts.causal_alignment)

  def reference_run(q, k, v, do, m):
    o, o_hp, lse = reference.forward(q, k, v, block_n=block_n, masks=m, **static)
    return (o, o_hp, lse), reference.backward(do, q, k, v, o_hp, lse, masks=m, **static)

  (o, o_hp, lse), grads = jax.jit(reference_run)(q, k, v, do, masks_j)
  to_t = lambda x: torch.from_numpy(np.array(x.astype(jnp.float32))).to(torch.bfloat16).to(device)
  qt, kt, vt, dot, ohp_t = map(to_t, (q, k, v, do, o_hp))
  masks_t = tuple(None if m is None else torch.from_numpy(np.array(m)).to(device) for m in masks_j)
  masks_d = tuple(None if m is None else torch_launch.describe(m) for m in masks_t)
  present = {n: m for n, m in zip(("q_len", "kv_len", "q_seg", "kv_seg"), masks_t) if m is not None}

  plan = plans.attention_forward(*map(torch_launch.describe, (qt, kt, vt)), opts, torch_launch.target(qt),
                                 config=ForwardConfig(16, 4, 1), masks=masks_d)
  tensors = dict(q=qt, k=kt, v=vt, **present, **tat._poisoned(plan, plan.scratch + ("o", "lse"), device))
  tensors["o_hp"] = tat._poisoned(plan, ("o_hp",), device)["o_hp"]
  torch_launch.execute(plan, tensors)
  f = lambda x: np.asarray(x.astype(jnp.float32))
  lse_k, lse_r = tat._np(tensors["lse"]), f(lse)
  assert (np.isneginf(lse_k) == np.isneginf(lse_r)).all(), "lse = -inf on the same rows"
  fin = lambda x: np.where(np.isneginf(lse_r), 0, x)
  tat.assert_close(fin(lse_k), fin(lse_r), rel=tat.BOUNDS["lse"], name="lse")
  tat.assert_close(tat._np(tensors["o"]), f(o), rel=tat.BOUNDS["O"], name="O")
  tat.assert_close(tat._np(tensors["o_hp"]), f(o_hp), rel=tat.BOUNDS["O'"], name="O'")

  dq_m, dq_n, kv_m, kv_n = blocks
  plan = plans.attention_backward(*map(torch_launch.describe, (dot, qt, kt, vt, ohp_t, tensors["lse"])), opts,
                                  torch_launch.target(qt), config=BackwardConfig(dq_m, dq_n, 4, 1, kv_n, kv_m, 4, 1),
                                  masks=masks_d)
  bt = dict(do=dot, q=qt, k=kt, v=vt, o_for_delta=ohp_t, lse=torch.from_numpy(f(lse).copy()).to(device), **present,
            **tat._poisoned(plan, plan.scratch + plan.outputs, device))
  torch_launch.execute(plan, bt)
  for name, want in zip(("dQ", "dK", "dV"), grads):
    tat.assert_close(tat._np(bt[name.lower()]), f(want), rel=tat.BOUNDS[name], name=name)


# Tq, Tk straddle the 16-row / 16- and 32-key tiles so every tile kind (skipped, masked, unmasked) occurs.
# Lengths alone, sorted segments alone and the causal left-only window run on the GPU only (CI time on the
# interpreter): on the CPU the combinations below ("all" holds a window and the causal mask) and
# test_numerics_modes_triton's "lengths" and "segments-empty-rows" kernels cover them.
GPU_ONLY_KERNEL_MASKS = ("lengths", "segments", "window-left-only-causal")


@pytest.mark.parametrize("name,tq,tk", [
    pytest.param(name, TQ, TK, marks=[pytest.mark.gpu] if name in GPU_ONLY_KERNEL_MASKS else [])
    for name in MASKS] + [("all", TK, TQ)])
def test_kernel_masks_match_reference(name, tq, tk):
  _kernel_case(MASKS[name], tq, tk, d=16, seed=len(name))


# d = 80 (D_PAD 128, five fq blocks) repeats d = 48's code path at about twice the interpreter's time: GPU only.
@pytest.mark.parametrize("d", [48, pytest.param(80, marks=pytest.mark.gpu)])
def test_kernel_padded_head_dims_match_reference(d):
  """D not a power of two: tiles padded to D_PAD with masked loads; fq blocks of 16 along D unchanged."""
  _kernel_case(MASKS["causal-lengths-segments"], 33, 40, d=d, seed=d)


def test_kernel_window_skips_tiles_with_the_same_result():
  """A window narrower than a tile with long sequences: most tiles are skipped (forward, dQ, dK/dV)."""
  _kernel_case((False, (3, 2), False, False, False), 80, 96, d=16, seed=7, blocks=(16, 16, 16, 16))
