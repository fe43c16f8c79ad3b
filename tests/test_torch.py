"""jqat.torch: the PyTorch shim (docs/API.md, section 2) against the JAX API.

CPU (always): CPU tensors go through DLPack to the XLA reference, so every
result must equal the JAX API's bit for bit; plus the vendor mapping/unpacking
behaviour, validation (and that nothing is modified on a failed check),
torch.compile, and -- under ``TRITON_INTERPRET=1`` -- the torch launcher
``jqat/ffi/torch_launch.py`` itself on strided BHSD views (tolerances of
tests/test_attention_triton.py, whose reasons apply unchanged: the interpreter
is not the reference).

GPU (``@pytest.mark.gpu`` and torch.cuda available): the torch path launches the
same kernels as the JAX Triton path, so results must be equal bit for bit; plus
no allocation in execute(), in-place rope, stream ordering and buffer reuse.
"""

import os

from conftest import HAS_GPU  # noqa: E402

os.environ.setdefault("TRITON_INTERPRET", "0" if HAS_GPU else "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import assert_close, assert_reordered_equal  # noqa: E402

torch = pytest.importorskip("torch")

import jqat  # noqa: E402
import jqat.torch as jt  # noqa: E402
from jqat.ffi.options import QATConfig  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA torch build and GPU")


def _bits(x):
  """Raw bits of a torch tensor or JAX array, as a NumPy array (for bitwise comparisons)."""
  if isinstance(x, torch.Tensor):
    x = x.detach().cpu()
    if x.dtype == torch.bfloat16:
      return x.view(torch.int16).numpy().view(np.uint16)
    return x.numpy().view(np.uint8 if x.dtype.itemsize == 1 else f"u{x.dtype.itemsize}")
  x = np.asarray(x)
  return x.view(f"u{x.dtype.itemsize}")


def _same(got, want, name):
  g, w = _bits(got), _bits(want)
  assert g.shape == w.shape, f"{name}: shape {g.shape} != {w.shape}"
  assert np.array_equal(g, w), f"{name}: {np.sum(g != w)} of {g.size} elements differ"


def _bhsd_inputs(b, h, hkv, sq, skv, d, device="cpu", dtype=torch.bfloat16, seed=0):
  g = torch.Generator().manual_seed(seed)
  mk = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)
  return mk(b, h, sq, d), mk(b, hkv, skv, d), mk(b, hkv, skv, d), mk(b, h, sq, d)


def _j(t):
  """BHSD torch tensor -> BTNH JAX array (host copy; test-side only)."""
  t = t.detach().cpu()
  x = jnp.asarray(t.float().numpy()).astype(jnp.bfloat16 if t.dtype == torch.bfloat16 else t.numpy().dtype)
  return jnp.swapaxes(x, 1, 2) if x.ndim == 4 else x


def _jax_expected(q, k, v, do, *, causal, cfg, implementation):
  """JAX API: forward (O, O', lse), explicit backward from O'/O, and grad of jqat.attention (BTNH)."""
  qj, kj, vj, doj = map(_j, (q, k, v, do))
  fwd = jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, is_causal=causal, implementation=implementation,
                                                       config=cfg))
  o, o_hp, lse = fwd(qj, kj, vj)
  o_fd = o_hp if cfg.high_precision_delta else o
  bwd = jax.jit(lambda *a: jqat.attention_backward(*a, is_causal=causal, implementation=implementation, config=cfg))
  grads = bwd(doj, qj, kj, vj, o_fd, lse)

  def loss_vjp(q, k, v):
    out, vjp = jax.vjp(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation=implementation,
                                                      quantize_qkv=cfg.quantize_qkv, quantize_p=cfg.quantize_p,
                                                      high_precision_delta=cfg.high_precision_delta,
                                                      quantize_p_backward=cfg.quantize_p_backward), q, k, v)
    return out, vjp(doj)

  out, autograd = jax.jit(loss_vjp)(qj, kj, vj)
  t = lambda x: jnp.swapaxes(x, 1, 2)
  return {"o": t(o), "o_hp": t(o_hp), "lse": lse, "grads": tuple(map(t, grads)), "out": t(out),
          "autograd": tuple(map(t, autograd))}


def _torch_results(q, k, v, do, *, causal, cfg):
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v, is_causal=causal) if cfg == QATConfig() else (None,) * 3
  qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
  out = jt.attention(qr, kr, vr, is_causal=causal, enable_gqa=True, quantize_qkv=cfg.quantize_qkv,
                     quantize_p=cfg.quantize_p, high_precision_delta=cfg.high_precision_delta,
                     quantize_p_backward=cfg.quantize_p_backward)
  out.backward(do)
  res = {"out": out.detach(), "autograd": (qr.grad, kr.grad, vr.grad)}
  if o is not None:
    res.update(o=o, o_hp=o_hp, lse=lse, grads=tuple(jt.nvfp4_attention_qat_backward(do, q, k, v, o_hp, lse,
                                                                                    is_causal=causal)))
  return res


def _reordered(got, want, name):
  """The CPU path runs its own jitted XLA programs: equal to the JAX API's up to FP32 summation order."""
  g = got.detach().float().numpy() if isinstance(got, torch.Tensor) else got
  assert_reordered_equal(g, np.asarray(want, np.float32), name=name, dtype=np.asarray(want).dtype)


def _compare(got, want, check=_same):
  """Every result against the JAX API's; ``check`` is bitwise (same kernels) or up to summation order."""
  for key, value in got.items():
    if isinstance(value, tuple):
      for name, a, e in zip(("dq", "dk", "dv"), value, want[key]):
        check(a, e, f"{key}.{name}")
    else:
      check(value, want[key], key)


# (B, H, Hkv, Sq, Skv, D, causal, config)
CASES = [
    (1, 2, 2, 17, 17, 64, True, QATConfig()),
    (2, 4, 2, 9, 33, 16, False, QATConfig()),
    (1, 2, 1, 17, 20, 32, True, QATConfig(quantize_p=False, high_precision_delta=False)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}H{c[1]}K{c[2]}-{c[3]}x{c[4]}-D{c[5]}-{c[6]}")
def test_cpu_equals_jax_api(case):
  b, h, hkv, sq, skv, d, causal, cfg = case
  q, k, v, do = _bhsd_inputs(b, h, hkv, sq, skv, d)
  got = _torch_results(q, k, v, do, causal=causal, cfg=cfg)
  _compare(got, _jax_expected(q, k, v, do, causal=causal, cfg=cfg, implementation="xla"), check=_reordered)
  assert got["out"].shape == q.shape


def test_tuple_dict_mapping_and_unpacking():
  r = jt.TupleDict(dq_tensor=1, dk_tensor=2, dv_tensor=3)
  dq, dk, dv = r
  assert (dq, dk, dv) == (1, 2, 3) and r["dk_tensor"] == 2 and r[2] == 3
  assert list(r.keys()) == ["dq_tensor", "dk_tensor", "dv_tensor"] and dict(r.items())["dv_tensor"] == 3
  q, k, v, do = _bhsd_inputs(1, 2, 2, 5, 5, 16)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v)
  assert o.is_contiguous() and o_hp.is_contiguous() and lse.shape == (1, 2, 5) and lse.dtype == torch.float32
  dq_buf = torch.empty_like(q)
  res = jt.nvfp4_attention_qat_backward(do, q, k, v, o_hp, lse, dq_tensor=dq_buf)
  dq, dk, dv = res
  assert res["dq_tensor"] is dq_buf and dq is dq_buf and res["dk_tensor"] is dk and res["dv_tensor"] is dv


def test_class_api_cpu_matches_wrapper():
  q, k, v, do = _bhsd_inputs(1, 2, 2, 9, 12, 32, seed=3)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v, is_causal=True)
  op = jt.Nvfp4AttentionQatBackward(q, k, v, o_hp, do, lse, is_causal=True)
  assert op.check_support() is True
  op.compile()
  ceil = lambda n: -(-n // 256) * 256
  # delta and fq(Q); fq(K) and fq(V) are written into dk's and dv's storage (the plan's stored_in).
  assert op.scratch_workspace_bytes() == ceil(1 * 2 * 9 * 4) + ceil(q.numel() * 2)
  ws = torch.empty(op.scratch_workspace_bytes(), dtype=torch.uint8)
  dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
  op.execute(q, k, v, o_hp, do, lse, dq, dk, dv, ws)
  want = jt.nvfp4_attention_qat_backward(do, q, k, v, o_hp, lse, is_causal=True)
  for a, e, n in zip((dq, dk, dv), want, ("dq", "dk", "dv")):
    _same(a, e, n)
  with pytest.raises(ValueError, match="workspace"):
    op.execute(q, k, v, o_hp, do, lse, dq, dk, dv, ws[:-1])
  with pytest.raises(ValueError, match="dq_tensor overlaps q_tensor"):
    op.execute(q, k, v, o_hp, do, lse, q, dk, dv, ws)


# ----------------------------------------------------------------------------- rope

def _rope_inputs(mode, seed=0, device="cpu"):
  g = torch.Generator().manual_seed(seed)
  quant, group, fmt = mode
  x = (torch.randn(7, 4, 128, generator=g) if quant == "fp4" and group == 32 else
       torch.randn(3, 5, 512, generator=g) * 3).to(torch.bfloat16)
  p = 11
  ang = torch.rand(p, 32, generator=g) * 6.3
  cache = torch.cat([ang.cos(), ang.sin()], dim=1).float().contiguous()
  rows = x.shape[0] if x.shape[-1] == 128 else x.shape[0] * x.shape[1]
  pos = torch.randint(0, p, (rows,), generator=g, dtype=torch.int32)
  if x.shape[-1] == 512:
    pos = pos.reshape(x.shape[:-1])
  return x.to(device), cache.to(device), pos.to(device)


MODES = [("fp4", 32, "ue8m0"), ("fp8", 32, "ue8m0"), ("fp4", 16, "e4m3")]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(map(str, m)))
def test_rope_cpu_equals_jax_bitwise_and_out_is_x(mode):
  x, cache, pos = _rope_inputs(mode)
  want = jqat.rope_qdq(jnp.asarray(x.float().numpy()).astype(jnp.bfloat16), jnp.asarray(cache.numpy()),
                       jnp.asarray(pos.numpy()), quantization=mode[0], group_size=mode[1], scale_format=mode[2],
                       implementation="xla")
  ptr = x.data_ptr()
  res = jt.rope_qdq_inplace(x, cache, pos, quantization=mode[0], group_size=mode[1], scale_format=mode[2])
  assert res["out"] is x and x.data_ptr() == ptr
  (out,) = res
  assert out is x
  _same(x, want, "rope")
  x2, cache2, pos2 = _rope_inputs(mode)
  op = jt.RopeQDQInplace(x2, cache2, pos2, quantization=mode[0], group_size=mode[1], scale_format=mode[2])
  assert op.check_support() and op.scratch_workspace_bytes() == 0
  op.compile()
  assert op.execute(x2, cache2, pos2)["out"] is x2
  _same(x2, want, "rope (class)")


def test_rope_validation_leaves_x_untouched():
  mode = MODES[0]
  x, cache, pos = _rope_inputs(mode)
  before = x.clone()

  def fails(exc, match, *args, **kw):
    with pytest.raises(exc, match=match):
      jt.rope_qdq_inplace(*args, **kw)
    _same(x, before, "x after a failed check")

  fails(ValueError, "x must not require grad", x.clone().requires_grad_(), cache, pos)
  fails(ValueError, "cache must not require grad", x, cache.clone().requires_grad_(), pos)
  fails(TypeError, "x must be bfloat16", x.float(), cache, pos)
  fails(ValueError, r"x must have shape \[N, H, 128\]", x[..., :64].contiguous(), cache, pos)
  fails(TypeError, "cache must be float32", x, cache.double(), pos)
  fails(ValueError, r"cache must have shape \[P, 64\]", x, cache[:, :32].contiguous(), pos)
  fails(TypeError, "positions must be int32 or int64", x, cache, pos.float())
  fails(ValueError, "positions must hold one id per token", x, cache, pos[:3])
  fails(ValueError, "cache must be on cpu", x, cache.to("meta"), pos)
  fails(NotImplementedError, r"x must be contiguous, .* with strides", x.transpose(0, 1), cache, pos.new_zeros(4))
  fails(ValueError, "quantization must be", x, cache, pos, quantization="int4")
  fails(ValueError, "group_size must be 16 or 32", x, cache, pos, group_size=64)
  # x overlapping its inputs: a cache (or positions) that is a view of x's storage.
  big = torch.zeros(7 * 4 * 128 + 11 * 64 * 2, dtype=torch.bfloat16)
  xv = big[:7 * 4 * 128].view(7, 4, 128)
  xv.copy_(x)
  alias_cache = big.view(torch.float32)[7 * 4 * 64 - 64:7 * 4 * 64 - 64 + 11 * 64].view(11, 64)
  snapshot = xv.clone()
  with pytest.raises(ValueError, match="x overlaps cache"):
    jt.rope_qdq_inplace(xv, alias_cache, pos)
  _same(xv, snapshot, "x after the overlap check")
  alias_pos = big.view(torch.int32)[:7]
  with pytest.raises(ValueError, match="x overlaps positions"):
    jt.rope_qdq_inplace(xv, cache, alias_pos)
  with pytest.raises(ValueError, match="backend must be 'frost'"):
    jt.RopeQDQInplace(x, cache, pos, backend="other")
  op = jt.RopeQDQInplace(x, cache, pos).compile()
  with pytest.raises(ValueError, match="planned head count"):
    op.execute(torch.zeros(7, 2, 128, dtype=torch.bfloat16), cache, pos)
  _same(x, before, "x")


def test_attention_validation():
  q, k, v, do = _bhsd_inputs(1, 4, 2, 5, 5, 16)
  with pytest.raises(ValueError, match="pass enable_gqa=True"):
    jt.attention(q, k, v)
  with pytest.raises(ValueError, match="q must have rank 4"):
    jt.attention(q[0], k, v, enable_gqa=True)
  with pytest.raises(TypeError, match="must share a dtype"):
    jt.attention(q, k.float(), v, enable_gqa=True)
  with pytest.raises(ValueError, match="multiple of 16"):
    jt.attention(q[..., :8], k[..., :8], v[..., :8], enable_gqa=True)
  with pytest.raises(ValueError, match="v must have the shape of k"):
    jt.attention(q, k, v[:, :, :3], enable_gqa=True)
  with pytest.raises(ValueError, match="k must be on cpu"):
    jt.attention(q, k.to("meta"), v, enable_gqa=True)
  q2, k2, v2, do2 = _bhsd_inputs(1, 2, 2, 5, 5, 16)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q2, k2, v2)
  with pytest.raises(ValueError, match="lse_tensor must be float32"):
    jt.nvfp4_attention_qat_backward(do2, q2, k2, v2, o_hp, lse.double())
  with pytest.raises(ValueError, match="do_tensor must have the shape"):
    jt.nvfp4_attention_qat_backward(do2[:, :, :3], q2, k2, v2, o_hp, lse)
  with pytest.raises(NotImplementedError, match="high_precision_o_tensor must be contiguous BHSD storage, got strides"):
    jt.nvfp4_attention_qat_backward(do2, q2, k2, v2, o_hp.transpose(1, 2).contiguous().transpose(1, 2), lse)
  with pytest.raises(ValueError, match="dk_tensor overlaps k_tensor"):
    jt.nvfp4_attention_qat_backward(do2, q2, k2, v2, o_hp, lse, dk_tensor=k2)
  with pytest.raises(TypeError, match="current_stream"):
    jt.nvfp4_attention_qat_backward(do2, q2, k2, v2, o_hp, lse, current_stream="s")  # noqa


def test_attention_accepts_strided_views_and_sdpa_layout():
  """A BTNH-contiguous tensor viewed as BHSD (the usual projection output) gives the same result."""
  q, k, v, do = _bhsd_inputs(1, 2, 2, 9, 9, 16, seed=5)
  a = jt.attention(q, k, v, is_causal=True)
  qs, ks, vs = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
  _same(jt.attention(qs, ks, vs, is_causal=True), a, "strided")


def _misaligned(x):
  """``x``'s values in a contiguous tensor whose storage starts one element past a 16-byte boundary."""
  flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:]
  return flat.view(x.shape).copy_(x)


def test_dense_copies_misaligned_tensors_only():
  """The forward reads K and V by TMA, which needs 16-byte aligned bases: dense() copies a tensor that is not."""
  from jqat.torch import _tensors as tt

  x = torch.randn(2, 3, 5, 16).to(torch.bfloat16)
  assert tt.dense(x) is x
  view = x.transpose(1, 2)  # dense, not contiguous: read in place
  assert tt.dense(view) is view
  bad = _misaligned(x)
  assert bad.data_ptr() % 16 == 2 and bad.is_contiguous()
  fixed = tt.dense(bad)
  assert fixed.data_ptr() % 16 == 0 and fixed.is_contiguous() and torch.equal(fixed, x)


def test_readable_copies_only_what_the_kernels_cannot_index():
  """tt.readable keeps an input whose last axis is contiguous, whose other strides are multiples of 16 elements and
  whose storage is 16-byte aligned (gaps and broadcast axes included: reading them is safe), and copies anything
  else contiguous; tt.dense copies a dense but misaligned tensor with its own strides, so that gradients allocated
  like it (torch.empty_like) have the strides the kernels write through."""
  from jqat.torch import _tensors as tt

  x = torch.randn(2, 8, 4, 64)
  for ok in (x.transpose(1, 2), torch.randn(2, 4, 8, 128)[..., :64], torch.randn(1, 4, 8, 64).expand(2, 4, 8, 64)):
    assert tt.readable(ok) is ok
  for bad in (torch.randn(2, 4, 64, 8).transpose(-1, -2), torch.randn(1, 1, 1, 1).expand(2, 4, 8, 64),
              torch.cat([x, torch.randn(2, 8, 4, 8)], -1)[..., :64], _misaligned(x)):
    got = tt.readable(bad)
    assert got is not bad and got.is_contiguous() and got.data_ptr() % 16 == 0 and torch.equal(got, bad)
  permuted = _misaligned(x).transpose(1, 2)  # dense, not contiguous, misaligned
  copy = tt.dense(permuted)
  assert copy.data_ptr() % 16 == 0 and copy.stride() == permuted.stride() == torch.empty_like(permuted).stride()
  assert torch.equal(copy, permuted)


class _Block(torch.nn.Module):
  """A projection and causal jt.attention, the way a model calls it (BHSD views of one projection)."""

  def __init__(self):
    super().__init__()
    self.qkv = torch.nn.Linear(32, 96)

  def forward(self, x):
    b, s, _ = x.shape
    q, k, v = self.qkv(x).view(b, s, 3, 2, 16).permute(2, 0, 3, 1, 4).to(torch.bfloat16)
    return jt.attention(q, k, v, is_causal=True).float().sum()


def _block(device):
  torch.manual_seed(0)
  return _Block().to(device), torch.randn(2, 8, 32, device=device)


def _compiled_block_matches_eager(device, backend, exact):
  """A module calling ``jt.attention`` under ``torch.compile``: its loss and gradient against eager mode."""
  m, x = _block(device)
  eager = m(x)
  eager.backward()
  g_eager = m.qkv.weight.grad.clone()
  m.zero_grad()
  compiled = torch.compile(m, backend=backend, fullgraph=True)  # fullgraph: a graph break raises
  out = compiled(x)
  out.backward()
  if exact:
    assert torch.equal(out.detach(), eager.detach())
    assert torch.equal(m.qkv.weight.grad, g_eager)
  else:  # inductor may fuse the Linear differently: bf16 q, k, v can differ in the last bit
    torch.testing.assert_close(out.detach(), eager.detach(), rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(m.qkv.weight.grad, g_eager, rtol=5e-2, atol=5e-2)
    assert torch.isfinite(m.qkv.weight.grad).all() and m.qkv.weight.grad.abs().sum() > 0


def _graph_breaks(device) -> int:
  m, x = _block(device)
  return torch._dynamo.explain(m)(x).graph_break_count


def test_torch_compile_runs():
  """CPU, aot_eager, fullgraph: jt.attention is a torch.library op with a registered backward."""
  _compiled_block_matches_eager("cpu", "aot_eager", exact=True)


def test_dynamo_explain_no_graph_break():
  assert _graph_breaks("cpu") == 0


@pytest.mark.gpu
@needs_cuda
def test_dynamo_explain_no_graph_break_gpu():
  assert _graph_breaks("cuda") == 0


@pytest.mark.gpu
@needs_cuda
def test_torch_compile_inductor_runs_gpu():
  """CUDA, the default inductor backend, forward and backward through the Triton kernels."""
  _compiled_block_matches_eager("cuda", "inductor", exact=False)


# ----------------------------------------------------------------------------- the launcher, interpreted on CPU

BOUNDS = {"O": 2e-3, "O'": 5e-4, "lse": 1e-5, "dQ": 1e-3, "dK": 1e-3, "dV": 2e-3}


@pytest.mark.skipif(not INTERPRET, reason="the launcher runs on CPU tensors only under TRITON_INTERPRET=1")
def test_torch_launcher_interpreted_on_strided_views():
  """The plans executed on BHSD tensors passed as BTNH views (and workspace views), against the reference."""
  from jqat.ffi.options import AttentionOptions
  from jqat.torch import _attention

  b, h, hkv, sq, skv, d = 1, 2, 1, 17, 20, 16
  q, k, v, do = _bhsd_inputs(b, h, hkv, sq, skv, d, seed=7)
  opts = AttentionOptions(d**-0.5, True, 16)
  o, o_hp = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
  lse = torch.full((b, h, sq), float("nan"))
  from triton.runtime import _allocation

  mine = lambda size, alignment, stream: None  # a caller's own allocator: the binding sets its own in a copy
  token = _allocation._allocator.set(mine)
  try:
    _attention.forward_kernels(q, k, v, o, o_hp, lse, opts)
    assert _allocation._allocator.get() is mine
  finally:
    _allocation._allocator.reset(token)
  want = _jax_expected(q, k, v, do, causal=True, cfg=QATConfig(), implementation="xla")
  f = lambda x: np.asarray(jnp.asarray(x).astype(jnp.float32)) if not isinstance(x, torch.Tensor) else x.float().numpy()
  # block_n=16 here vs the JAX default 64 moves only fq(P) (bound O), never O' or lse.
  assert_close(f(o_hp), f(want["o_hp"]), rel=BOUNDS["O'"], name="O'")
  assert_close(f(lse), f(want["lse"]), rel=BOUNDS["lse"], name="lse")
  assert_close(f(o), f(want["o"]), rel=3e-2, name="O (block_n 16 vs 64)")
  # Backward into caller buffers with a workspace; the reference's O' and lse as inputs.
  ro_hp = torch.from_numpy(f(want["o_hp"]).copy()).bfloat16()
  rlse = torch.from_numpy(f(want["lse"]).copy())
  op = jt.Nvfp4AttentionQatBackward(q, k, v, ro_hp, do, rlse, is_causal=True)
  op.check_support()
  ws = torch.full((op.scratch_workspace_bytes(),), 255, dtype=torch.uint8)
  grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
  _attention.backward_kernels(do, q, k, v, ro_hp, rlse, op.opts, out=grads, workspace=ws)
  for name, a, e in zip(("dQ", "dK", "dV"), grads, want["grads"]):
    assert_close(f(a), f(e), rel=BOUNDS[name], name=name)


@pytest.mark.skipif(not INTERPRET, reason="the launcher runs on CPU tensors only under TRITON_INTERPRET=1")
def test_backward_on_layouts_the_kernels_cannot_index_interpreted():
  """A d_out whose row stride is not a multiple of 16 elements (O concatenated with a narrow tensor: autograd hands
  the backward such a view) and a dense, permuted q whose storage is not 16-byte aligned, its gradient allocated like
  it (torch.empty_like, as the op does): the gradients of the contiguous call, bit for bit (the same kernels on the
  same values). Before, the kernels read the first with its stride rounded down and wrote dQ of the second in the
  layout of its contiguous copy."""
  from jqat.ffi.options import AttentionOptions
  from jqat.torch import _attention

  b, h, hkv, sq, skv, d = 1, 2, 1, 17, 20, 16
  q, k, v, do = _bhsd_inputs(b, h, hkv, sq, skv, d, seed=11)
  opts = AttentionOptions(d**-0.5, True, 16)
  o, o_hp, lse = torch.empty_like(q), torch.empty_like(q), torch.empty((b, h, sq))
  _attention.forward_kernels(q, k, v, o, o_hp, lse, opts)

  def grads(do, q):
    out = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    _attention.backward_kernels(do, q, k, v, o_hp, lse, opts, out=out)
    return out

  want = grads(do, q)
  odd_do = torch.cat([do, torch.zeros(b, h, sq, 8, dtype=do.dtype)], -1)[..., :d]
  assert odd_do.stride(2) == d + 8
  permuted_q = _misaligned(q.transpose(1, 2)).transpose(1, 2)
  for name, got in (("odd-stride d_out", grads(odd_do, q)), ("misaligned permuted q", grads(do, permuted_q))):
    for g_name, a, e in zip(("dQ", "dK", "dV"), got, want):
      _same(a, e, f"{name}: {g_name}")


# ----------------------------------------------------------------------------- GPU

def _cuda_case(seed=0, b=2, h=4, hkv=2, sq=300, skv=257, d=128):
  return _bhsd_inputs(b, h, hkv, sq, skv, d, device="cuda", seed=seed)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("case", [(2, 4, 2, 300, 257, 128, True, QATConfig()),
                                  (1, 4, 4, 129, 1000, 64, False, QATConfig()),
                                  (1, 2, 1, 64, 64, 256, True, QATConfig(False, False, False, False)),
                                  (1, 4, 2, 100, 100, 128, False, QATConfig(quantize_p_backward=False))],
                         ids=lambda c: f"B{c[0]}H{c[1]}K{c[2]}-{c[3]}x{c[4]}-D{c[5]}-{c[6]}")
def test_cuda_equals_jax_triton_bitwise_gpu(case):
  b, h, hkv, sq, skv, d, causal, cfg = case
  q, k, v, do = _bhsd_inputs(b, h, hkv, sq, skv, d, device="cuda")
  got = _torch_results(q, k, v, do, causal=causal, cfg=cfg)
  torch.cuda.synchronize()
  _compare(got, _jax_expected(q, k, v, do, causal=causal, cfg=cfg, implementation="triton"))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(map(str, m)))
def test_cuda_rope_in_place_equals_jax_triton_gpu(mode):
  x, cache, pos = _rope_inputs(mode, device="cuda")
  want = jqat.rope_qdq(_j(x), jnp.asarray(cache.cpu().numpy()),
                       jnp.asarray(pos.cpu().numpy()), quantization=mode[0], group_size=mode[1],
                       scale_format=mode[2], implementation="triton")
  ptr = x.data_ptr()
  op = jt.RopeQDQInplace(x, cache, pos, quantization=mode[0], group_size=mode[1], scale_format=mode[2])
  op.check_support()
  op.compile()
  before = torch.cuda.memory_allocated()
  out = op.execute(x, cache, pos)["out"]
  assert torch.cuda.memory_allocated() == before
  assert out is x and x.data_ptr() == ptr
  torch.cuda.synchronize()
  _same(x, want, "rope")
  x2, cache2, pos2 = _rope_inputs(mode, device="cuda")
  res = jt.rope_qdq_inplace(x2, cache2, pos2, quantization=mode[0], group_size=mode[1], scale_format=mode[2])
  assert res["out"] is x2
  torch.cuda.synchronize()
  _same(x2, want, "rope (wrapper)")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("quantize_qkv", [False, True])
def test_cuda_misaligned_inputs_gpu(quantize_qkv):
  """Inputs one element off a 16-byte boundary (without QKV quantization the forward reads the caller's K and V
  by TMA) give the bits of aligned ones: the shim copies them first."""
  q, k, v, do = _cuda_case(seed=4, d=80)
  kw = dict(is_causal=False, enable_gqa=True, quantize_qkv=quantize_qkv)
  want = jt.attention(q, k, v, **kw)
  got = jt.attention(*map(_misaligned, (q, k, v)), **kw)
  torch.cuda.synchronize()
  _same(got, want, "out")


@pytest.mark.gpu
@needs_cuda
def test_cuda_execute_allocates_nothing_gpu():
  q, k, v, do = _cuda_case(seed=1, hkv=4)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v, is_causal=True)
  op = jt.Nvfp4AttentionQatBackward(q, k, v, o_hp, do, lse, is_causal=True)
  op.check_support()
  op.compile()
  ws = torch.empty(op.scratch_workspace_bytes(), dtype=torch.uint8, device="cuda")
  dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
  torch.cuda.synchronize()
  before = torch.cuda.memory_allocated()
  op.execute(q, k, v, o_hp, do, lse, dq, dk, dv, ws)
  assert torch.cuda.memory_allocated() == before
  want = jt.nvfp4_attention_qat_backward(do, q, k, v, o_hp, lse, is_causal=True)
  torch.cuda.synchronize()
  for a, e, n in zip((dq, dk, dv), want, ("dq", "dk", "dv")):
    _same(a, e, n)


def _long_kernel(stream, t):
  """Queues a few hundred ms of matmuls on ``stream`` whose result lands in ``t`` (adds exactly 0)."""
  with torch.cuda.stream(stream):
    a = torch.ones(4096, 4096, device="cuda")
    w = torch.full((4096, 4096), 1e-4, device="cuda")
    for _ in range(40):
      a = (a @ w).clamp_(-1.0, 1.0)  # stays finite
    t.add_(a.reshape(-1)[: t.numel()].reshape(t.shape).mul(0).to(t.dtype))


@pytest.mark.gpu
@needs_cuda
def test_cuda_ordered_on_callers_stream_gpu():
  """Inputs produced on s1 by a long kernel; the call on current_stream=s1 sees them without any sync."""
  q, k, v, do = _cuda_case(seed=2)
  want = jt.nvfp4_attention_qat_backward(do, q, k, v, *jt.nvfp4_attention_qat_forward(q, k, v)[1:])
  want_fwd = jt.nvfp4_attention_qat_forward(q, k, v)
  torch.cuda.synchronize()
  s1 = torch.cuda.Stream()
  with torch.cuda.stream(s1):  # produce the inputs on s1, behind a long kernel
    q1, k1, v1, do1 = (torch.zeros_like(x) for x in (q, k, v, do))
  _long_kernel(s1, q1)
  with torch.cuda.stream(s1):
    for dst, src in zip((q1, k1, v1, do1), (q, k, v, do)):
      dst.copy_(src)
  # No sync: the work is ordered on s1 (passed as a Stream and as a raw handle).
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q1, k1, v1, current_stream=s1)
  grads = jt.nvfp4_attention_qat_backward(do1, q1, k1, v1, o_hp, lse, current_stream=s1.cuda_stream)
  s1.synchronize()
  for a, e, n in zip((o, o_hp, lse) + tuple(grads), tuple(want_fwd) + tuple(want), ("o", "o_hp", "lse", "dq", "dk",
                                                                                     "dv")):
    _same(a, e, n)
  x, cache, pos = _rope_inputs(MODES[1], device="cuda")
  ref = x.clone()
  jt.rope_qdq_inplace(ref, cache, pos, quantization="fp8")
  with torch.cuda.stream(s1):
    x1 = torch.zeros_like(x)
  _long_kernel(s1, x1)
  with torch.cuda.stream(s1):
    x1.copy_(x)
  jt.rope_qdq_inplace(x1, cache, pos, quantization="fp8", current_stream=s1)
  s1.synchronize()
  _same(x1, ref, "rope on s1")


@pytest.mark.gpu
@needs_cuda
def test_cuda_freed_inputs_not_reused_in_flight_gpu():
  """Inputs deleted right after the call, then the same sizes allocated and overwritten on the same stream.

  Same-stream ordering makes this hold by construction: the call queued its kernels on the current
  stream before returning; torch's caching allocator hands a freed block only to later allocations
  on the same stream (cross-stream use would need record_stream), so the overwriting fill is queued
  after the kernels that read the freed storage and cannot run before them.
  """
  q, k, v, do = _cuda_case(seed=3)
  o_want, o_hp_want, lse_want = jt.nvfp4_attention_qat_forward(q, k, v)
  want = jt.nvfp4_attention_qat_backward(do, q, k, v, o_hp_want, lse_want)
  torch.cuda.synchronize()
  q1, k1, v1, do1 = (x.clone() for x in (q, k, v, do))
  _long_kernel(torch.cuda.current_stream(), q1)  # keep the stream busy so the call is still queued
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q1, k1, v1)
  grads = tuple(jt.nvfp4_attention_qat_backward(do1, q1, k1, v1, o_hp, lse))
  del q1, k1, v1, do1
  junk = [torch.empty_like(x).fill_(float("nan")) for x in (q, k, v, do)]
  torch.cuda.synchronize()
  for a, e, n in zip((o, o_hp, lse) + grads, (o_want, o_hp_want, lse_want) + tuple(want),
                     ("o", "o_hp", "lse", "dq", "dk", "dv")):
    _same(a, e, n)
  del junk


@pytest.mark.skipif(not INTERPRET, reason="the launcher runs on CPU tensors only under TRITON_INTERPRET=1")
@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(map(str, m)))
def test_torch_launcher_rope_interpreted(mode):
  """The rope plan executed by the torch binding writes over x itself; bit-exact with the reference."""
  x, cache, pos = _rope_inputs(mode)
  want = jqat.rope_qdq(_j(x), jnp.asarray(cache.numpy()), jnp.asarray(pos.numpy()), quantization=mode[0],
                       group_size=mode[1], scale_format=mode[2], implementation="xla")
  ptr = x.data_ptr()
  op = jt.RopeQDQInplace(x, cache, pos, quantization=mode[0], group_size=mode[1], scale_format=mode[2])
  op.check_support()
  op._launch(x, cache, pos)
  assert x.data_ptr() == ptr
  _same(x, want, "rope (interpreted launcher)")


def test_torch_launcher_rope_plans_follow_the_shapes(monkeypatch):
  """One prepared op over inputs of other shapes (token counts, cache lengths): each launch uses its own shapes'
  plan, also after older plans were dropped to keep the op's cache bounded; bit-exact with the reference."""
  from jqat.torch import vendor  # noqa: PLC0415

  monkeypatch.setattr(vendor, "_PLANS_KEPT", 2)
  mode = ("fp4", 32, "ue8m0")
  x, cache, pos = _rope_inputs(mode)
  op = jt.RopeQDQInplace(x, cache, pos)
  op.check_support()
  for tokens, p in ((7, 11), (3, 11), (7, 5), (9, 11), (7, 11)):  # the last one's plan was dropped
    x, cache, pos = _rope_inputs(mode, seed=tokens + p)
    x, cache, pos = x[:tokens].contiguous(), cache[:p].contiguous(), pos[:tokens].contiguous()  # ids >= p: clamped
    want = jqat.rope_qdq(_j(x), jnp.asarray(cache.numpy()), jnp.asarray(pos.numpy()), implementation="xla")
    op._launch(x, cache, pos)
    _same(x, want, f"rope ({tokens} tokens, cache of {p})")
    assert len(op._plans) <= 2


def test_rope_refuses_an_inference_tensor_outside_inference_mode():
  """x made under torch.inference_mode() cannot be written in place outside it: refused before anything runs
  (it was overwritten and then raised)."""
  mode = MODES[0]
  x, cache, pos = _rope_inputs(mode)
  with torch.inference_mode():
    xi = x.clone()
  before = xi.clone()
  with pytest.raises(ValueError, match="x is an inference tensor"):
    jt.rope_qdq_inplace(xi, cache, pos)
  _same(xi, before, "inference x after the refusal")
  with torch.inference_mode():  # inside inference mode the in-place write is allowed
    assert jt.rope_qdq_inplace(xi, cache, pos)["out"] is xi


# ----------------------------------------------------------------------------- masks

def _mask_kwargs(b, sq, skv, device="cpu"):
  """Padding lengths (int64, as torch makes them), packed segment ids, a window and bottom-right alignment."""
  seg = lambda n: torch.arange(n, device=device).unsqueeze(0).repeat(b, 1) // 7
  return dict(query_seq_lengths=torch.tensor([sq - 3] + [sq] * (b - 1), device=device),
              key_value_seq_lengths=torch.tensor([skv] * (b - 1) + [skv - 5], device=device),
              q_segment_ids=seg(sq), kv_segment_ids=seg(skv), local_window_size=(9, 4),
              causal_alignment="bottom_right")


def _masked_results(q, k, v, do, kw, implementation):
  """torch: out and autograd grads; JAX API (BTNH): the same, for the same masks."""
  qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
  out = jt.attention(qr, kr, vr, is_causal=True, enable_gqa=True, **kw)
  out.backward(do)
  jkw = {n: (_j(m.int()) if isinstance(m, torch.Tensor) else m) for n, m in kw.items()}
  t = lambda x: jnp.swapaxes(x, 1, 2)

  def loss_vjp(q, k, v):
    res, vjp = jax.vjp(lambda q, k, v: jqat.attention(q, k, v, is_causal=True, implementation=implementation, **jkw),
                       q, k, v)
    return res, vjp(_j(do))

  want, grads = jax.jit(loss_vjp)(*map(_j, (q, k, v)))
  return {"out": out.detach(), "autograd": (qr.grad, kr.grad, vr.grad)}, {"out": t(want),
                                                                          "autograd": tuple(map(t, grads))}


def test_masks_cpu_equal_jax_api():
  q, k, v, do = _bhsd_inputs(2, 4, 2, 23, 30, 32)
  got, want = _masked_results(q, k, v, do, _mask_kwargs(2, 23, 30), "xla")
  _compare(got, want, check=_reordered)


def test_mask_validation():
  q, k, v, _ = _bhsd_inputs(2, 2, 2, 8, 8, 16)
  with pytest.raises(ValueError, match=r"q_segment_ids must have shape \(2, 8\)"):
    jt.attention(q, k, v, q_segment_ids=torch.zeros(2, 9, dtype=torch.int32),
                 kv_segment_ids=torch.zeros(2, 8, dtype=torch.int32))
  with pytest.raises(TypeError, match="key_value_seq_lengths must have an integer dtype"):
    jt.attention(q, k, v, key_value_seq_lengths=torch.zeros(2))


@pytest.mark.gpu
@needs_cuda
def test_masks_cuda_equal_jax_triton_bitwise_gpu():
  q, k, v, do = _bhsd_inputs(2, 4, 2, 300, 257, 96, device="cuda")
  got, want = _masked_results(q, k, v, do, _mask_kwargs(2, 300, 257, device="cuda"), "triton")
  torch.cuda.synchronize()
  _compare(got, want)


# ----------------------------------------------------------------------------- the forward where nothing differentiates

def _out_without_grad(q, k, v, monkeypatch, **kw):
  """jt.attention with no input requiring grad and under torch.no_grad: O, and which op ran (attention_out's
  forward_out is recorded)."""
  from jqat.torch import _attention

  calls = []
  real = _attention.forward_out
  monkeypatch.setattr(_attention, "forward_out", lambda *a, **k: calls.append(1) or real(*a, **k))
  plain = jt.attention(q, k, v, **kw)
  qr = q.clone().requires_grad_()
  with torch.no_grad():
    no_grad = jt.attention(qr, k, v, **kw)
  assert len(calls) == 2, "both calls take attention_out"
  assert not plain.requires_grad and not no_grad.requires_grad
  return plain, no_grad


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])])
def test_no_grad_forward_is_the_training_forwards_output(monkeypatch, device):
  """Without anything to differentiate jt.attention runs ``jqat::attention_out`` (on CUDA the plan without
  residuals); its O equals the differentiable op's O bit for bit (the same XLA program on the CPU, the same O
  arithmetic in the kernels on CUDA), masks and GQA included; with grad the usual op runs."""
  q, k, v, _ = _bhsd_inputs(2, 4, 2, 37, 45, 64, device=device, seed=3)
  kw = dict(is_causal=True, enable_gqa=True, local_window_size=(20, 0),
            key_value_seq_lengths=torch.tensor([45, 30], device=device))
  plain, no_grad = _out_without_grad(q, k, v, monkeypatch, **kw)
  qr = q.clone().requires_grad_()
  with_grad = jt.attention(qr, k, v, **kw)
  assert with_grad.requires_grad
  _same(plain, with_grad.detach(), "O without grad")
  _same(no_grad, with_grad.detach(), "O under no_grad")


def test_no_grad_forward_under_torch_compile():
  """torch.compile (fullgraph) of a module calling jt.attention under no_grad: attention_out traces without a graph
  break and gives the eager O."""
  q, k, v, _ = _bhsd_inputs(1, 2, 2, 17, 17, 32, seed=5)
  fn = lambda q, k, v: jt.attention(q, k, v, is_causal=True)
  with torch.no_grad():
    eager = fn(q, k, v)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(q, k, v)
  _same(compiled, eager, "compiled O")


@pytest.mark.skipif(not INTERPRET, reason="the launcher runs on CPU tensors only under TRITON_INTERPRET=1")
def test_torch_launcher_without_residuals_interpreted():
  """forward_kernels(residuals=False) on CPU tensors (the interpreter): O bit for bit the residual plan's O; also
  with a register cap in the forward's launch config (Triton's launcher takes ``maxnreg``)."""
  from jqat.ffi import plan as plans
  from jqat.ffi.options import AttentionOptions
  from jqat.torch import _attention

  b, h, hkv, sq, skv, d = 1, 2, 1, 17, 20, 16
  q, k, v, _ = _bhsd_inputs(b, h, hkv, sq, skv, d, seed=9)
  opts = AttentionOptions(d**-0.5, True, 16)
  o, o_hp, lse = torch.full_like(q, float("nan")), torch.full_like(q, float("nan")), torch.full((b, h, sq), 0.0)
  _attention.forward_kernels(q, k, v, o, o_hp, lse, opts)
  alone = torch.full_like(q, float("nan"))
  _attention.forward_kernels(q, k, v, alone, None, None, opts, residuals=False)
  _same(alone, o, "O alone")
  capped = torch.full_like(q, float("nan"))
  plans.set_config_override("fwd", "maxnreg=128")
  try:
    _attention.forward_kernels(q, k, v, capped, None, None, opts, residuals=False)
  finally:
    plans.set_config_override("fwd", None)
  _same(capped, o, "O alone, registers capped")


# ----------------------------------------------------------------------------- issue 43: derivatives, vendor contract


def test_forward_mode_ad_raises_instead_of_a_zero_tangent():
  """torch.func.jvp / jacfwd through jqat.torch.attention gave an all-zero tangent with no error (inputs that do not
  require grad took the op without autograd, which functorch treats as a constant). SDPA raises; so do the ops."""
  import torch.autograd.forward_ad as fwAD

  q, k, v, _ = _bhsd_inputs(1, 2, 2, 8, 8, 32)
  with pytest.raises(NotImplementedError, match="no forward-mode derivative"):
    torch.func.jvp(lambda v: jt.attention(q, k, v), (v,), (torch.ones_like(v),))
  with pytest.raises(NotImplementedError, match="no forward-mode derivative"):
    torch.func.jacfwd(lambda v: jt.attention(q, k, v).float())(v)
  with fwAD.dual_level():
    with pytest.raises(NotImplementedError, match="q carries a tangent"):
      jt.attention(fwAD.make_dual(q, torch.ones_like(q)), k, v)
    with pytest.raises(NotImplementedError, match="no forward-mode derivative"):
      jt.nvfp4_attention_qat_forward(q, fwAD.make_dual(k, torch.ones_like(k)), v)
    x, cache, pos = _rope_inputs(MODES[0])
    with pytest.raises(NotImplementedError, match="rope_qdq_inplace has no forward-mode derivative"):
      jt.rope_qdq_inplace(fwAD.make_dual(x, torch.ones_like(x)), cache, pos)
  # Reverse mode is unchanged.
  vr = v.clone().requires_grad_()
  jt.attention(q, k, vr).float().sum().backward()
  assert vr.grad is not None and vr.grad.abs().sum() > 0


def test_prepared_ops_refuse_execute_before_compile():
  """execute() before compile() ran (and on CUDA compiled in execute); it raises RuntimeError and touches nothing."""
  x, cache, pos = _rope_inputs(MODES[0])
  before = x.clone()
  op = jt.RopeQDQInplace(x, cache, pos)
  with pytest.raises(RuntimeError, match=r"needs compile\(\) first"):
    op.execute(x, cache, pos)
  _same(x, before, "x after execute before compile")
  q, k, v, do = _bhsd_inputs(1, 2, 2, 9, 12, 32, seed=3)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v)
  bop = jt.Nvfp4AttentionQatBackward(q, k, v, o_hp, do, lse)
  bop.check_support()
  ws = torch.zeros(bop.scratch_workspace_bytes(), dtype=torch.uint8)
  dq, dk, dv = (torch.full_like(t, 7.0) for t in (q, k, v))
  with pytest.raises(RuntimeError, match=r"needs compile\(\) first"):
    bop.execute(q, k, v, o_hp, do, lse, dq, dk, dv, ws)
  assert (dq == 7).all() and (dk == 7).all() and (dv == 7).all() and (ws == 0).all()


def test_prepared_ops_return_tuple_dicts():
  """The class APIs returned x and a plain tuple; like the functions they return TupleDicts (result["out"] is x)."""
  x, cache, pos = _rope_inputs(MODES[0])
  op = jt.RopeQDQInplace(x, cache, pos).compile()
  res = op.execute(x, cache, pos)
  assert isinstance(res, jt.TupleDict) and res["out"] is x and res[0] is x
  (out,) = res
  assert out is x
  q, k, v, do = _bhsd_inputs(1, 2, 2, 9, 12, 32, seed=3)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v)
  bop = jt.Nvfp4AttentionQatBackward(q, k, v, o_hp, do, lse).compile()
  ws = torch.empty(bop.scratch_workspace_bytes(), dtype=torch.uint8)
  dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
  res = bop.execute(q, k, v, o_hp, do, lse, dq, dk, dv, ws)
  assert isinstance(res, jt.TupleDict) and res["dq_tensor"] is dq and res["dk_tensor"] is dk and res["dv_tensor"] is dv
  assert tuple(res) == (dq, dk, dv)


def test_vendor_error_types_follow_torch_conventions():
  """A layout the ops do not take is NotImplementedError naming the strides (was ValueError); positions of another
  dtype than the plan's are a ValueError naming positions (was TypeError)."""
  x, cache, pos = _rope_inputs(MODES[0])
  with pytest.raises(NotImplementedError, match=r"x must be contiguous.*strides \(128, 512, 1\)"):
    jt.rope_qdq_inplace(x.transpose(0, 1), cache, pos.new_zeros(4))
  with pytest.raises(NotImplementedError, match=r"cache must be contiguous.*strides"):
    jt.rope_qdq_inplace(x, torch.empty(64, 11).t(), pos)
  op = jt.RopeQDQInplace(x, cache, pos).compile()
  with pytest.raises(ValueError, match="positions must have the planned dtype torch.int32"):
    op.execute(x, cache, pos.to(torch.int64))
  q, k, v, do = _bhsd_inputs(1, 2, 2, 9, 12, 32, seed=3)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v)
  with pytest.raises(NotImplementedError, match=r"dq_tensor must be contiguous, got strides"):
    jt.nvfp4_attention_qat_backward(do, q, k, v, o_hp, lse, dq_tensor=torch.empty_like(q).transpose(2, 3).contiguous()
                                    .transpose(2, 3))


@pytest.mark.skipif(not INTERPRET, reason="the launcher runs on CPU tensors only under TRITON_INTERPRET=1")
def test_rope_kernel_write_bumps_the_version_counter():
  """The kernel writes x behind autograd's back: on CUDA a tensor that autograd had saved was rewritten and the
  backward silently used the rotated values (the CPU path, x.copy_, raised). The kernel path (here in the
  interpreter, on CUDA the same code) now bumps x's version counter, so the backward raises."""
  x, cache, pos = _rope_inputs(MODES[0])
  w = torch.ones_like(x, requires_grad=True)
  y = (w * x).float().sum()  # saves x for w's gradient
  version = x._version
  op = jt.RopeQDQInplace(x, cache, pos)
  op.check_support()
  op._launch(x, cache, pos)
  assert x._version > version
  with pytest.raises(RuntimeError, match="modified by an inplace operation"):
    y.backward()


# GPU: the prepared ops' contract (seeds/cudnn_*.md): execute launches the compiled kernel and nothing else.


def _no_compiles(monkeypatch):
  """Makes any Triton compile (or JIT dispatch, which may compile) in the block fail the test."""
  import triton
  from triton.runtime import jit as triton_jit

  def refuse(*a, **k):
    raise AssertionError("a prepared op compiled (or dispatched through Triton's JIT) in execute")

  monkeypatch.setattr(triton, "compile", refuse)
  monkeypatch.setattr(triton_jit.JITFunction, "run", refuse)


def _at_offset(t, elements):
  """A contiguous copy of ``t`` whose storage starts ``elements`` elements into a larger buffer (a pointer offset)."""
  buf = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
  out = buf[elements:].view(t.shape)
  out.copy_(t)
  return out


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(map(str, m)))
def test_cuda_rope_prepared_never_compiles_in_execute_gpu(monkeypatch, mode):
  """New token counts and pointer offsets below 16 bytes compiled 1-2 kernels in execute; compile() now builds the
  aligned and the any-offset kernels and execute launches one of them: the wrapper's bits, no compile."""
  x, cache, pos = _rope_inputs(mode, device="cuda")
  op = jt.RopeQDQInplace(x, cache, pos, quantization=mode[0], group_size=mode[1], scale_format=mode[2]).compile()
  cases = [(x, cache, pos), (x[:2].clone(), cache, pos[:2].clone()),  # a new token count (not a view of x)
           (_at_offset(x, 1), _at_offset(cache, 1), _at_offset(pos, 1)),  # pointers off 16-byte alignment
           (_at_offset(x[:1].contiguous(), 3), cache[:5].contiguous(), _at_offset(pos[:1].contiguous(), 1))]
  wants = []
  for cx, cc, cp in cases:
    ref = cx.clone()
    jt.rope_qdq_inplace(ref, cc, cp, quantization=mode[0], group_size=mode[1], scale_format=mode[2])
    wants.append(ref)
  torch.cuda.synchronize()
  _no_compiles(monkeypatch)
  for cx, cc, cp in cases:
    assert op.execute(cx, cc, cp)["out"] is cx
  torch.cuda.synchronize()
  for i, ((cx, _, _), want) in enumerate(zip(cases, wants)):
    _same(cx, want, f"rope case {i}")


@pytest.mark.gpu
@needs_cuda
def test_cuda_prepared_ops_capture_only_their_kernels_gpu():
  """Captured in a CUDA graph, execute records its kernels and no tensor work (it reshaped positions and made BTNH
  views and workspace slices); replayed, the graph gives execute's bits."""
  from torch.utils._python_dispatch import TorchDispatchMode

  class Log(TorchDispatchMode):
    def __init__(self):
      super().__init__()
      self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
      self.ops.append(str(func))
      return func(*args, **(kwargs or {}))

  x, cache, pos = _rope_inputs(MODES[1], device="cuda")
  op = jt.RopeQDQInplace(x, cache, pos, quantization="fp8").compile()
  want = x.clone()
  op.execute(want, cache, pos)
  q, k, v, do = _cuda_case(seed=5)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v, is_causal=True)
  bop = jt.Nvfp4AttentionQatBackward(q, k, v, o_hp, do, lse, is_causal=True).compile()
  ws = torch.empty(bop.scratch_workspace_bytes(), dtype=torch.uint8, device="cuda")
  grads = tuple(torch.empty_like(t) for t in (q, k, v))
  want_grads = jt.nvfp4_attention_qat_backward(do, q, k, v, o_hp, lse, is_causal=True)
  xg = x.clone()
  torch.cuda.synchronize()
  graph, log = torch.cuda.CUDAGraph(), Log()
  stream = torch.cuda.Stream()
  stream.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(stream):
    op.execute(x.clone(), cache, pos)  # warm-ups outside the capture, as torch recommends
    bop.execute(q, k, v, o_hp, do, lse, *grads, ws)
    with torch.cuda.graph(graph, stream=stream):
      with log:
        op.execute(xg, cache, pos)
        bop.execute(q, k, v, o_hp, do, lse, *grads, ws)
  assert log.ops == [], f"tensor operations recorded besides the kernels: {log.ops}"
  xg.copy_(x)
  graph.replay()
  torch.cuda.synchronize()
  _same(xg, want, "rope (graph)")
  for a, e, n in zip(grads, want_grads, ("dq", "dk", "dv")):
    _same(a, e, n + " (graph)")


@pytest.mark.gpu
@needs_cuda
def test_cuda_prepared_backward_never_compiles_and_refuses_misaligned_buffers_gpu(monkeypatch):
  """New buffers of the planned shapes: execute launches compile()'s kernels, no compile; a buffer off 16-byte
  alignment (which compiled another specialization, or was copied: an allocation) raises naming it."""
  q, k, v, do = _cuda_case(seed=6)
  o, o_hp, lse = jt.nvfp4_attention_qat_forward(q, k, v)
  op = jt.Nvfp4AttentionQatBackward(q, k, v, o_hp, do, lse).compile()
  want = jt.nvfp4_attention_qat_backward(do, q, k, v, o_hp, lse)
  ws = torch.empty(op.scratch_workspace_bytes(), dtype=torch.uint8, device="cuda")
  q2, k2, v2, do2, o2, lse2 = (t.clone() for t in (q, k, v, do, o_hp, lse))
  grads = tuple(torch.empty_like(t) for t in (q, k, v))
  torch.cuda.synchronize()
  _no_compiles(monkeypatch)
  op.execute(q2, k2, v2, o2, do2, lse2, *grads, ws)
  torch.cuda.synchronize()
  for a, e, n in zip(grads, want, ("dq", "dk", "dv")):
    _same(a, e, n)
  with pytest.raises(ValueError, match="q_tensor must be 16-byte aligned"):
    op.execute(_at_offset(q, 1), k, v, o_hp, do, lse, *grads, ws)


@pytest.mark.gpu
@needs_cuda
def test_cuda_rope_bumps_the_version_counter_gpu():
  """On CUDA a tensor that autograd had saved was rewritten silently; now the backward raises, as on the CPU."""
  for run in ("wrapper", "class"):
    x, cache, pos = _rope_inputs(MODES[0], device="cuda")
    w = torch.ones_like(x, requires_grad=True)
    y = (w * x).float().sum()
    if run == "wrapper":
      jt.rope_qdq_inplace(x, cache, pos)
    else:
      jt.RopeQDQInplace(x, cache, pos).compile().execute(x, cache, pos)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
      y.backward()
