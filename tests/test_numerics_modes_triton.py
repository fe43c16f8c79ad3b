"""The Triton kernels with p_scale="row" (docs/NUMERICS.md), against the float64 row-mode oracle
(``test_numerics_modes.row_oracle``) and the XLA reference.

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
from oracle import visible_oracle  # noqa: E402
from test_numerics_modes import GRAD_BOUND, OUT_BOUND, row_oracle  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import jqat  # noqa: E402
import jqat.torch  # noqa: E402
from jqat._src import attention_reference as reference  # noqa: E402
from jqat.ffi import plan as plans  # noqa: E402
from jqat.ffi import torch_launch  # noqa: E402
from jqat.ffi.options import AttentionOptions, QATConfig  # noqa: E402
from jqat.kernels_triton.attention_bwd import BackwardConfig  # noqa: E402
from jqat.kernels_triton.attention_fwd import ForwardConfig  # noqa: E402

BOUNDS = {"O": 2e-3, "O'": 5e-4, "lse": 1e-5, "row_max": 1e-5, "dQ": 1e-3, "dK": 1e-3, "dV": 2e-3}

if os.environ["TRITON_INTERPRET"] == "1":
  # Triton 3.6's interpreter calls int() on a 1-element array for a program-id-derived loop bound, which
  # NumPy >= 2.4 refuses (the same patch as test_attention_triton; applying it twice is harmless).
  from triton.runtime import interpreter as _interpreter

  _patch = _interpreter._patch_lang_tensor

  def _patch_numpy2(tensor, scope):
    _patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

  if getattr(_interpreter._patch_lang_tensor, "__name__", "") != "_patch_lang_tensor_numpy2":
    _interpreter._patch_lang_tensor = _patch_numpy2


def _np(t):
  return t.detach().float().cpu().numpy().astype(np.float64)


def _kernels(q, k, v, do, opts, masks):
  """Forward then backward plans on torch tensors (small tiles); the backward reads the kernel's lse and m."""
  mask_t = tuple(None if m is None else torch_launch.describe(m) for m in masks)
  mask_v = {n: m for n, m in zip(("q_len", "kv_len", "q_seg", "kv_seg"), masks) if m is not None}
  plan = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), opts, torch_launch.target(q),
                                 config=ForwardConfig(16, 4, 1), masks=mask_t)
  t = dict(q=q, k=k, v=v, **mask_v, **torch_launch.allocate(plan, plan.scratch + plan.outputs, q.device))
  for name in plan.outputs:  # anything a kernel forgets to write stays NaN
    t[name].fill_(float("nan"))
  torch_launch.execute(plan, t)
  o, o_hp, lse, m = (t[n] for n in ("o", "o_hp", "lse", "row_max"))
  plan = plans.attention_backward(*map(torch_launch.describe, (do, q, k, v, o_hp, lse)), opts,
                                  torch_launch.target(q), config=BackwardConfig(16, 16, 4, 1, 32, 16, 4, 1),
                                  masks=mask_t, row_max=torch_launch.describe(m))
  tb = dict(do=do, q=q, k=k, v=v, o_for_delta=o_hp, lse=lse, row_max=m, **mask_v,
            **torch_launch.allocate(plan, plan.scratch + plan.outputs, q.device))
  torch_launch.execute(plan, tb)
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
  o, o_hp, lse, m = reference.forward(*jx[:3], scale=opts.scale, is_causal=opts.is_causal, block_n=16, cfg=opts.config,
                                      masks=masks_j, p_scale="row")
  grads = reference.backward(jx[3], *jx[:3], o_hp, lse, scale=opts.scale, is_causal=opts.is_causal, cfg=opts.config,
                             masks=masks_j, p_scale="row", row_max=m)
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
