"""The Triton kernels with p_scale="row" and qkv_scale="tensor" (docs/NUMERICS.md), against the float64
oracles (``test_numerics_modes.row_oracle``; ``oracle.attention_oracle`` fed ``fq_tensor_oracle``'s two-level
Q, K, V) and the XLA reference. The two-level Q, K, V the kernels write are checked bit for bit.

CPU: the kernels run under ``TRITON_INTERPRET=1`` on torch CPU tensors at tiny shapes, launched through
the plan (``jqat.ffi.plan``) as the torch binding does. GPU (``@pytest.mark.gpu``): the public API with
``implementation="triton"`` against ``implementation="xla"``.

Bounds (relative Frobenius): against the reference those of ``test_attention_triton`` (exp2 vs exp
last-bit differences, occasionally flipping an fq code); against the float64 oracle those of
``test_numerics_modes``.
"""

import os

from conftest import HAS_GPU, assert_close, kernel_device

os.environ.setdefault("TRITON_INTERPRET", "0" if HAS_GPU else "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from oracle import attention_grad_oracle, attention_oracle, bits, visible_oracle  # noqa: E402
from test_numerics_modes import GRAD_BOUND, OUT_BOUND, fq_tensor_oracle, row_oracle  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import jqat  # noqa: E402
import jqat.torch  # noqa: E402
from jqat._src import attention as api  # noqa: E402
from jqat.ffi import plan as plans  # noqa: E402
from jqat.ffi import torch_launch  # noqa: E402
from jqat.ffi.options import AttentionOptions, QATConfig  # noqa: E402
from jqat.kernels_triton.attention_bwd import BackwardConfig  # noqa: E402
from jqat.kernels_triton.attention_fwd import ForwardConfig  # noqa: E402

BOUNDS = {"O": 2e-3, "O'": 5e-4, "lse": 1e-5, "row_max": 1e-5, "dQ": 1e-3, "dK": 1e-3, "dV": 2e-3}


def _np(t):
  return t.detach().float().cpu().numpy().astype(np.float64)


def _kernels(q, k, v, do, opts, masks, scratch=None):
  """Forward then backward plans on torch tensors (small tiles); the backward reads the kernel's lse and, with
  p_scale="row", m (None otherwise). scratch: a dict that receives the forward's scratch tensors (fq(K), fq(V)
  and K's, V's encode scales) and then the backward's (fq(Q), Q's encode scale, delta; the backward writes its
  fq(K), fq(V) into dk's and dv's storage, which the gradients then overwrite)."""
  mask_t = tuple(None if m is None else torch_launch.describe(m) for m in masks)
  mask_v = {n: m for n, m in zip(("q_len", "kv_len", "q_seg", "kv_seg"), masks) if m is not None}
  plan = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), opts, torch_launch.target(q),
                                 config=ForwardConfig(16, 4, 1), masks=mask_t)
  t = dict(q=q, k=k, v=v, **mask_v, **torch_launch.allocate(plan, plan.scratch + plan.outputs, q.device))
  for name in plan.outputs:  # anything a kernel forgets to write stays NaN
    t[name].fill_(float("nan"))
  torch_launch.execute(plan, t)
  if scratch is not None:
    scratch.update((n, t[n]) for n in plan.scratch)
  o, o_hp, lse, m = (t.get(n) for n in ("o", "o_hp", "lse", "row_max"))
  plan = plans.attention_backward(*map(torch_launch.describe, (do, q, k, v, o_hp, lse)), opts,
                                  torch_launch.target(q), config=BackwardConfig(16, 16, 4, 1, 32, 16, 4, 1),
                                  masks=mask_t, row_max=None if m is None else torch_launch.describe(m))
  tb = dict(do=do, q=q, k=k, v=v, o_for_delta=o_hp, lse=lse, **({} if m is None else dict(row_max=m)), **mask_v,
            **torch_launch.allocate(plan, plan.scratch + plan.outputs, q.device))
  torch_launch.execute(plan, tb)
  if scratch is not None:
    scratch.update((n, tb[n]) for n in plan.scratch)
  return o, o_hp, lse, m, tb["dq"], tb["dk"], tb["dv"]


CASES = {
    "full": dict(b=1, tq=17, tk=40, n=2, kh=1, d=32, causal=False, masks=(None,) * 4),
    "causal-gqa": dict(b=1, tq=40, tk=40, n=2, kh=1, d=16, causal=True, masks=(None,) * 4),
    "lengths": dict(b=2, tq=20, tk=33, n=1, kh=1, d=16, causal=False,
                    masks=(np.array([20, 7]), np.array([9, 33]), None, None)),
    "segments-empty-rows": dict(b=1, tq=24, tk=32, n=1, kh=1, d=16, causal=False,
                                masks=(None, None, np.array([[0] * 8 + [1] * 8 + [5] * 8]),
                                       np.array([[0] * 16 + [1] * 16]))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_row_kernels_match_oracle_and_reference(name):
  device = kernel_device()
  c = CASES[name]
  b, tq, tk, n, kh, d = (c[x] for x in ("b", "tq", "tk", "n", "kh", "d"))
  rng = np.random.default_rng(0)
  arrays = [rng.normal(0, s, shape).astype(np.float32)
            for s, shape in ((2.0, (b, tq, n, d)), (1.0, (b, tk, kh, d)), (1.0, (b, tk, kh, d)), (1.0, (b, tq, n, d)))]
  arrays = [torch.from_numpy(x).to(torch.bfloat16) for x in arrays]
  q, k, v, do = (x.to(device) for x in arrays)
  masks_np = c["masks"]
  masks_t = tuple(None if m is None else torch.from_numpy(np.asarray(m, np.int32)).to(device) for m in masks_np)
  opts = AttentionOptions(d**-0.5, c["causal"], 16, QATConfig(), p_scale="row")
  got = dict(zip(("O", "O'", "lse", "row_max", "dQ", "dK", "dV"), map(_np, _kernels(q, k, v, do, opts, masks_t))))

  jx = [jnp.asarray(x.float().numpy(), jnp.bfloat16) for x in arrays]
  masks_j = tuple(None if m is None else jnp.asarray(m, jnp.int32) for m in masks_np)
  # The jitted reference (one compile per case; eager dispatch compiled every primitive on its own).
  o, o_hp, lse, m = api._reference_forward(*jx[:3], scale=opts.scale, is_causal=opts.is_causal, block_n=16,
                                           cfg=opts.config, masks=masks_j, p_scale="row")
  grads = api._reference_backward(jx[3], *jx[:3], o_hp, lse, scale=opts.scale, is_causal=opts.is_causal,
                                  cfg=opts.config, masks=masks_j, p_scale="row", row_max=m)
  ref = dict(zip(("O", "O'", "lse", "row_max", "dQ", "dK", "dV"),
                 (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (o, o_hp, lse, m, *grads))))
  vis = visible_oracle(b, tq, tk, is_causal=c["causal"], q_len=masks_np[0], kv_len=masks_np[1], q_seg=masks_np[2],
                       kv_seg=masks_np[3])
  want = dict(zip(("O", "O'", "lse", "row_max", "dQ", "dK", "dV"),
                  row_oracle(*(x.float().numpy() for x in arrays[:3]), arrays[3].float().numpy(), scale=opts.scale,
                             block_n=16, vis=vis)))
  for key in ("lse", "row_max"):  # empty rows: -inf in all three
    assert (np.isinf(got[key]) == np.isinf(want[key])).all() and (np.isinf(ref[key]) == np.isinf(want[key])).all()
    for d_ in (got, ref, want):
      d_[key] = np.where(np.isinf(d_[key]), 0.0, d_[key])
  for key, bound in BOUNDS.items():
    assert_close(got[key], ref[key], rel=bound, name=f"{key} kernel vs reference")
    oracle_bound = {"lse": 1e-5, "row_max": 1e-5}.get(key, OUT_BOUND if key in ("O", "O'") else GRAD_BOUND)
    assert_close(got[key], want[key], rel=oracle_bound, name=f"{key} kernel vs float64")
  rows = ~vis.any(-1)  # [B, Tq]: rows that see no key give O = O' = 0 and dQ = 0 exactly
  for key in ("O", "O'", "dQ"):
    assert (got[key][rows] == 0).all(), key


NAMES = ("O", "O'", "lse", "row_max", "dQ", "dK", "dV")
# Q past 2688 (block scales would saturate), K below the 2^-9 block floor (block fq would give 0), V moderate.
TENSOR_SPREAD = (3e3, 1e-4, 1.0, 1.0)
# Scores of order 1: Q.K ~ 3e3 * 1e-4 * sqrt(D).
TENSOR_SCALE = {"lengths-gqa": 32**-0.5 * 3.0, "causal-segments-row": 16**-0.5 * 3.0, "causal-d144": 144**-0.5 * 3.0}
TENSOR_CASES = {
    "lengths-gqa": dict(b=2, tq=20, tk=33, n=2, kh=1, d=32, causal=False, p_scale="block",
                        masks=(np.array([20, 13]), np.array([33, 9]), None, None)),
    "causal-segments-row": dict(b=1, tq=24, tk=32, n=1, kh=1, d=16, causal=True, p_scale="row",
                                masks=(None, None, np.array([[0] * 8 + [1] * 16]), np.array([[0] * 12 + [1] * 20]))),
    # Above D = 128 the forward reads fq(enc * Q) from the pass instead of rounding its own Q tile.
    "causal-d144": dict(b=1, tq=19, tk=21, n=1, kh=1, d=144, causal=True, p_scale="block",
                        masks=(None, np.array([17]), None, None)),
}


def _tensor_run(c, arrays, scale):
  """Kernels (with the backward's scratch) and the XLA reference for qkv_scale="tensor": float64 dicts."""
  device = kernel_device()
  masks_np = c["masks"]
  masks_t = tuple(None if m is None else torch.from_numpy(np.asarray(m, np.int32)).to(device) for m in masks_np)
  opts = AttentionOptions(scale, c["causal"], 16, QATConfig(), p_scale=c["p_scale"], qkv_scale="tensor")
  scratch = {}
  out = _kernels(*(x.to(device) for x in arrays), opts, masks_t, scratch)
  got = {k: _np(x) for k, x in zip(NAMES, out) if x is not None}
  jx = [jnp.asarray(x.float().numpy(), jnp.bfloat16) for x in arrays]
  masks_j = tuple(None if m is None else jnp.asarray(m, jnp.int32) for m in masks_np)
  kw = dict(scale=scale, is_causal=c["causal"], cfg=opts.config, masks=masks_j, p_scale=c["p_scale"],
            qkv_scale="tensor")
  # The jitted reference (one compile per case, shared by the tests with the same shapes and options).
  fwd = api._reference_forward(*jx[:3], block_n=16, **kw)
  grads = api._reference_backward(jx[3], *jx[:3], fwd[1], fwd[2], row_max=fwd[3] if len(fwd) > 3 else None, **kw)
  names = [n for n in NAMES if n in got]
  ref = dict(zip(names, (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (*fwd, *grads))))
  return got, ref, {k: x.float().cpu().numpy() for k, x in scratch.items()}


def _zero_empty_rows(got, *others):
  """Rows that see no key have lse = row_max = -inf: the same rows in every result, then set to 0 for the bounds."""
  for key in ("lse", "row_max"):
    if key in got:
      empty = np.isinf(got[key])
      for d_ in others:
        if key in d_:
          assert (np.isinf(d_[key]) == empty).all(), key
      for d_ in (got, *others):
        if key in d_:
          d_[key] = np.where(np.isinf(d_[key]), 0.0, d_[key])


def _assert_two_level_bitwise(scratch, arrays, masks):
  """The kernels' fq(enc * X) and encode scales of Q, K, V are the oracle's bit for bit."""
  for name, x, length in (("q", arrays[0], masks[0]), ("k", arrays[1], masks[1]), ("v", arrays[2], masks[1])):
    y, dec = fq_tensor_oracle(x.float().numpy(), length)
    np.testing.assert_array_equal(bits(scratch[f"{name}_hat"]), bits(y), err_msg=f"fq(enc * {name})")
    np.testing.assert_array_equal(bits(np.float32(1) / scratch[f"{name}_enc"]), bits(dec.reshape(dec.shape[0], -1)),
                                  err_msg=f"{name} decode scale")


@pytest.mark.parametrize("name", list(TENSOR_CASES))
def test_tensor_kernels_match_oracle_and_reference(name):
  """qkv_scale="tensor" through the plans: the two-level Q, K, V bitwise, outputs and gradients against the
  reference and (p_scale="block") the float64 oracle fed the oracle's two-level Q, K, V."""
  c = TENSOR_CASES[name]
  b, tq, tk, n, kh, d = (c[x] for x in ("b", "tq", "tk", "n", "kh", "d"))
  rng = np.random.default_rng(1)
  shapes = ((b, tq, n, d), (b, tk, kh, d), (b, tk, kh, d), (b, tq, n, d))
  arrays = [torch.from_numpy((rng.normal(0, 1, sh) * sp).astype(np.float32)).to(torch.bfloat16)
            for sh, sp in zip(shapes, TENSOR_SPREAD)]
  got, ref, scratch = _tensor_run(c, arrays, TENSOR_SCALE[name])
  masks_np = c["masks"]
  _assert_two_level_bitwise(scratch, arrays, masks_np)
  vis = visible_oracle(b, tq, tk, is_causal=c["causal"], q_len=masks_np[0], kv_len=masks_np[1], q_seg=masks_np[2],
                       kv_seg=masks_np[3])
  want = {}
  if c["p_scale"] == "block":
    deq = [y * dec for y, dec in (fq_tensor_oracle(x.float().numpy(), ln) for x, ln in
                                  zip(arrays[:3], (masks_np[0], masks_np[1], masks_np[1])))]
    kw = dict(scale=TENSOR_SCALE[name], is_causal=False, quantize_qkv=False, vis=vis)
    want.update(zip(NAMES[:3], attention_oracle(*deq, block_n=16, **kw)))
    want.update(zip(NAMES[4:], attention_grad_oracle(arrays[3].float().numpy(), *deq, got["O'"], got["lse"], **kw)))
  _zero_empty_rows(got, ref, want)
  for key in got:
    assert_close(got[key], ref[key], rel=BOUNDS[key], name=f"{key} kernel vs reference")
    if key in want:
      oracle_bound = 1e-5 if key == "lse" else OUT_BOUND if key in ("O", "O'") else GRAD_BOUND
      assert_close(got[key], want[key], rel=oracle_bound, name=f"{key} kernel vs float64")
  rows = ~vis.any(-1)
  for key in ("O", "O'", "dQ"):
    assert (got[key][rows] == 0).all(), key


def test_tensor_kernels_nan_and_inf():
  """qkv_scale="tensor" with non-finite inputs (docs/NUMERICS.md): a NaN in a live key makes its slab fall back
  to block scales and reaches every output of its batch (O, O', lse and all gradients), as in the reference; a
  NaN in a key past the length stays out of the amax; an Inf in Q saturates its slab's block scales."""
  c = TENSOR_CASES["lengths-gqa"]  # its shapes and options: the reference compiled for it is reused
  rng = np.random.default_rng(2)
  q, k, v, do = (rng.normal(0, 1, s).astype(np.float32) * sp for s, sp in
                 zip(((2, 20, 2, 32), (2, 33, 1, 32), (2, 33, 1, 32), (2, 20, 2, 32)), (1.0, 0.1, 1.0, 1.0)))
  k[0, 3, 0, 0] = np.nan  # live: batch 0 is NaN throughout
  k[1, 20, 0, 5] = np.nan  # past kv_len[1] = 9: no effect
  q[1, 2, 1, 7] = np.inf  # batch 1, head 1: enc = 1, its block saturates at 2688
  arrays = [torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v, do)]
  got, ref, scratch = _tensor_run(c, arrays, TENSOR_SCALE["lengths-gqa"])
  _assert_two_level_bitwise(scratch, arrays, c["masks"])
  assert scratch["k_enc"][0, 0] == 1.0 and scratch["q_enc"][1, 1] == 1.0 and scratch["k_enc"][1, 0] != 1.0
  for key in ("O", "O'", "lse", "dQ", "dK", "dV"):
    assert np.isnan(got[key][0]).all() and np.isnan(ref[key][0]).all(), key
  got, ref = ({k: x[1:] for k, x in d_.items()} for d_ in (got, ref))
  _zero_empty_rows(got, ref)  # batch 1's rows past query_seq_lengths
  for key in ("O", "O'", "lse", "dQ", "dK", "dV"):
    assert_close(got[key], ref[key], rel=BOUNDS[key], name=f"{key} batch 1")


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
    assert_close(a, e, rel=BOUNDS.get(name.removeprefix("vjp "), 2e-3), name=name)


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
    assert_close(a, e, rel=BOUNDS[name], name=name)


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
  names = [n for n in NAMES if p_scale == "row" or n != "row_max"]
  got, ref = (dict(zip(names + ["vjp dQ", "vjp dK", "vjp dV"], res[i])) for i in ("triton", "xla"))
  _zero_empty_rows(got, ref)
  for name in got:
    assert_close(got[name], ref[name], rel=BOUNDS[name.removeprefix("vjp ")], name=name)


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
    assert_close(a, e, rel=BOUNDS[name], name=name)
