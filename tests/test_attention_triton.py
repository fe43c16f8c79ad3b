"""The Triton QAT attention kernels against the pure-JAX reference (docs/NUMERICS.md, 4-5).

CPU: the kernels run under ``TRITON_INTERPRET=1`` on torch CPU tensors at tiny
shapes, launched directly (the JAX binding needs a GPU). GPU
(``@pytest.mark.gpu``, with ``TRITON_INTERPRET=0``): the public API with
``implementation="triton"`` against ``implementation="xla"`` over a grid of
shapes and switches, plus determinism, jit and vmap.

Tolerances (relative Frobenius, ``assert_close``), the same on both paths:
- lse 1e-5: the kernels use exp2/log2 with log2(e) folded into the scale and
  sum in another order; both only move FP32 rounding (~1e-7 relative).
- O 2e-3: those last-bit differences of p can flip fq(p) at an E2M1 or E4M3
  rounding boundary; one flip moves one probability by one E2M1 step (up to
  1/3 of its value), i.e. a ~1e-2 change of one row of O.
- O' 5e-4, dQ and dK 1e-3: no fq of p, only bf16 rounding (of p, dS and the
  stored outputs), where a flip moves one term by 2**-8 relative.
- dV 2e-3: fq(P) again, as for O.
"""

import os

from conftest import HAS_GPU, kernel_device  # noqa: E402

# Before triton is imported: the interpreter on CPU machines, compiled kernels on a GPU.
os.environ.setdefault("TRITON_INTERPRET", "0" if HAS_GPU else "1")

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cases import poisoned
from conftest import assert_close
from oracle import fq_oracle

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import jqat  # noqa: E402
from jqat._src import attention_reference as reference  # noqa: E402
from jqat.ffi import plan as plans  # noqa: E402
from jqat.ffi import torch_launch  # noqa: E402
from jqat.ffi.options import (  # noqa: E402
  P_ROW_RANGE,  # noqa: E402
  AttentionOptions,  # noqa: E402
  QATConfig,  # noqa: E402
)
from jqat.kernels_triton import attention_bwd as kbwd  # noqa: E402
from jqat.kernels_triton import attention_fwd as kfwd  # noqa: E402
from jqat.kernels_triton import nvfp4 as knv  # noqa: E402
from jqat.kernels_triton.attention_bwd import BackwardConfig  # noqa: E402
from jqat.kernels_triton.attention_common import dot_flags  # noqa: E402
from jqat.kernels_triton.attention_fwd import ForwardConfig  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
BOUNDS = {"O": 2e-3, "O'": 5e-4, "lse": 1e-5, "dQ": 1e-3, "dK": 1e-3, "dV": 2e-3}

_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}




def _flags(device, dtype_name):
  interpret = device == "cpu"
  cc = None if interpret else torch.cuda.get_device_capability()
  return {**knv.quant_flags(cc, interpret), **dot_flags(dtype_name, interpret)}


def _nan_like(x, shape=None, dtype=None):
  """A poisoned output buffer: any element the kernel forgets to write stays NaN."""
  return torch.full(x.shape if shape is None else shape, float("nan"), dtype=dtype or x.dtype, device=x.device)


def _fq(x, flags):
  d = x.shape[-1]
  x2 = x.reshape(-1, d)
  out = _nan_like(x2)
  knv.fake_quantize_kernel[(triton.cdiv(x2.shape[0], 16), triton.cdiv(d, 64))](
      x2, x2.shape[0], d, d, d, out, BLOCK_R=16, BLOCK_C=64, HW_E4M3=flags["HW_E4M3"], HW_E2M1=flags["HW_E2M1"])
  return out.reshape(x.shape)


def _qflags(flags):
  return {k: flags[k] for k in ("HW_E4M3", "HW_E2M1")}


def _kernel_forward(q, k, v, *, scale, is_causal, block_n, block_m, cfg):
  """The forward plan executed on torch tensors with a small query tile (``block_m``)."""
  opts = AttentionOptions(scale, is_causal, block_n, cfg)
  plan = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), opts, torch_launch.target(q),
                                 config=ForwardConfig(block_m, 4, 1))
  tensors = dict(q=q, k=k, v=v, **poisoned(plan, plan.scratch + ("o", "lse"), q.device))
  tensors["o_hp"] = poisoned(plan, ("o_hp",), q.device)["o_hp"]
  torch_launch.execute(plan, tensors)
  return tensors["o"], tensors["o_hp"], tensors["lse"]


def _kernel_backward(do, q, k, v, o_for_delta, lse, *, scale, is_causal, blocks, cfg):
  """The backward plan executed on torch tensors; blocks = (dQ M, dQ N, dKdV M, dKdV N)."""
  dq_m, dq_n, kv_m, kv_n = blocks
  opts = AttentionOptions(scale, is_causal, 64, cfg)
  plan = plans.attention_backward(*map(torch_launch.describe, (do, q, k, v, o_for_delta, lse)), opts,
                                  torch_launch.target(q), config=BackwardConfig(dq_m, dq_n, 4, 1, kv_n, kv_m, 4, 1))
  tensors = dict(do=do, q=q, k=k, v=v, o_for_delta=o_for_delta, lse=lse,
                 **poisoned(plan, plan.scratch + plan.outputs, q.device))
  torch_launch.execute(plan, tensors)
  return tensors["dq"], tensors["dk"], tensors["dv"]


def _inputs(b, tq, tk, n, kh, d, dtype_name, seed=0):
  """Random q, k, v, dO as FP32 NumPy arrays already rounded to ``dtype_name``."""
  rng = np.random.default_rng(seed)
  mk = lambda *s: torch.from_numpy(rng.standard_normal(s).astype(np.float32)).to(_TORCH[dtype_name]).float().numpy()
  return mk(b, tq, n, d), mk(b, tk, kh, d), mk(b, tk, kh, d), mk(b, tq, n, d)


def _np(t):
  return t.detach().float().cpu().numpy()


# (B, Tq, Tk, N, K, D, causal, dtype, forward block_n, config): tiny, odd sizes, every switch.
ALL_ON = QATConfig()
CPU_CASES = [
    (1, 17, 40, 2, 1, 64, False, "bfloat16", 16, ALL_ON),
    (1, 40, 40, 2, 2, 64, True, "bfloat16", 32, ALL_ON),
    (1, 40, 17, 2, 1, 16, True, "bfloat16", 16, QATConfig(quantize_qkv=False)),
    (1, 1, 17, 2, 2, 64, False, "bfloat16", 16, QATConfig(quantize_p=False)),
    (1, 17, 1, 2, 1, 16, True, "bfloat16", 16, QATConfig(high_precision_delta=False, quantize_p_backward=False)),
    (2, 17, 40, 2, 2, 16, True, "bfloat16", 16, QATConfig(False, False, False, False)),
    (1, 17, 40, 2, 1, 64, True, "float32", 16, ALL_ON),
    (1, 17, 33, 2, 1, 16, False, "float16", 16, ALL_ON),
]


def _case_id(case):
  b, tq, tk, n, kh, d, causal, dtype, bn, cfg = case
  sw = "".join(str(int(x)) for x in dataclasses.astuple(cfg))
  return f"B{b}-Tq{tq}-Tk{tk}-N{n}K{kh}-D{d}-{'causal' if causal else 'full'}-{dtype}-bn{bn}-cfg{sw}"


@functools.cache
def _reference(case, seed=0):
  """Reference forward and backward (O' or O for delta per the switch) on the case's inputs."""
  b, tq, tk, n, kh, d, causal, dtype, bn, cfg = case
  q, k, v, do = (jnp.asarray(x).astype(dtype) for x in _inputs(b, tq, tk, n, kh, d, dtype, seed))
  scale = d**-0.5
  # Under jit: one compile per case instead of one per primitive.
  o, o_hp, lse = jax.jit(functools.partial(reference.forward, scale=scale, is_causal=causal, block_n=bn, cfg=cfg))(
      q, k, v)
  o_fd = o_hp if cfg.high_precision_delta else o
  grads = jax.jit(functools.partial(reference.backward, scale=scale, is_causal=causal, cfg=cfg))(do, q, k, v, o_fd, lse)
  f = lambda x: np.asarray(x.astype(jnp.float32))
  return f(o), f(o_hp), f(lse), f(o_fd), tuple(f(g) for g in grads)


@pytest.mark.parametrize("case", CPU_CASES, ids=_case_id)
def test_kernels_match_reference(case):
  device = kernel_device()
  b, tq, tk, n, kh, d, causal, dtype, bn, cfg = case
  to_t = lambda x: torch.from_numpy(np.array(x)).to(_TORCH[dtype]).to(device)
  q, k, v, do = (to_t(x) for x in _inputs(b, tq, tk, n, kh, d, dtype))
  scale = d**-0.5
  r_o, r_ohp, r_lse, r_ofd, r_grads = _reference(case)

  o, o_hp, lse = _kernel_forward(q, k, v, scale=scale, is_causal=causal, block_n=bn, block_m=16, cfg=cfg)
  assert_close(_np(o), r_o, rel=BOUNDS["O"], name="O")
  assert_close(_np(o_hp), r_ohp, rel=BOUNDS["O'"], name="O'")
  assert_close(_np(lse), r_lse, rel=BOUNDS["lse"], name="lse")

  # The backward gets the reference's O'/O and lse, so it is checked on its own.
  lse_t = torch.from_numpy(r_lse.copy()).to(device)
  grads = _kernel_backward(do, q, k, v, to_t(r_ofd), lse_t, scale=scale, is_causal=causal, blocks=(16, 16, 16, 32),
                           cfg=cfg)
  for name, got, want in zip(("dQ", "dK", "dV"), grads, r_grads):
    assert_close(_np(got), want, rel=BOUNDS[name], name=name)


@pytest.mark.parametrize("case", [CPU_CASES[0], (1, 70, 33, 2, 1, 128, True, "bfloat16", 16, ALL_ON)], ids=_case_id)
def test_backward_writes_fq_q_over_o_prime(case):
  """The JAX binding's backward plan (``q_hat_over_out``): one launch forms delta from O' and writes fq(Q) over
  O''s storage, so fq(Q) needs no scratch. Gradients within the reference's bounds, and fq(Q) is what the
  NumPy oracle quantizes, bit for bit. D = 128 quantizes a 64-row block in two slices of 32 rows."""
  device = kernel_device()
  b, tq, tk, n, kh, d, causal, dtype, bn, cfg = case
  to_t = lambda x: torch.from_numpy(np.array(x)).to(_TORCH[dtype]).to(device)
  q, k, v, do = (to_t(x) for x in _inputs(b, tq, tk, n, kh, d, dtype))
  _, _, r_lse, r_ofd, r_grads = _reference(case)
  o_for_delta = to_t(r_ofd)  # overwritten with fq(Q)
  lse = torch.from_numpy(r_lse.copy()).to(device)
  plan = plans.attention_backward(*map(torch_launch.describe, (do, q, k, v, o_for_delta, lse)),
                                  AttentionOptions(d**-0.5, causal, 64, cfg), torch_launch.target(q),
                                  config=BackwardConfig(16, 16, 4, 1, 32, 16, 4, 1), q_hat_over_out=True)
  assert "q_hat" not in plan.scratch and plan.stored_in["q_hat"] == "o_for_delta"
  tensors = dict(do=do, q=q, k=k, v=v, o_for_delta=o_for_delta, lse=lse,
                 **poisoned(plan, plan.scratch + plan.outputs, device))
  torch_launch.execute(plan, tensors)
  for name, got, want in zip(("dQ", "dK", "dV"), (tensors["dq"], tensors["dk"], tensors["dv"]), r_grads):
    assert_close(_np(got), want, rel=BOUNDS[name], name=name)
  np.testing.assert_array_equal(_np(o_for_delta).view(np.uint32), fq_oracle(_np(q)).view(np.uint32))


def test_redo_walks_exactly_the_flagged_key_tiles():
  """The Triton dK/dV kernel's REDO launch (the plan's after the warp-specialized kernel's causal walk): where a key
  tile's flag is set it walks that tile exactly, reading fq(K) and fq(V) from dK's and dV's storage, and writes its dK
  and dV there (without NaN the exact walk's values are the fast walk's, bit for bit: the same tiles in the same
  order); the other tiles keep what their storage holds. Causal, 40 query rows, 64 keys in four tiles of 16, GQA."""
  device = kernel_device()
  b, tq, tk, n, kh, d = 1, 40, 64, 2, 1, 32
  to_t = lambda x: torch.from_numpy(np.array(x)).to(torch.bfloat16).to(device)
  q, k, v, do = (to_t(x) for x in _inputs(b, tq, tk, n, kh, d, "bfloat16"))
  _, o_hp, lse = _kernel_forward(q, k, v, scale=d**-0.5, is_causal=True, block_n=16, block_m=16, cfg=ALL_ON)
  plan = plans.attention_backward(*map(torch_launch.describe, (do, q, k, v, o_hp, lse)),
                                  AttentionOptions(d**-0.5, True, 64, ALL_ON), torch_launch.target(q),
                                  config=BackwardConfig(16, 16, 4, 1, 16, 16, 4, 1))
  dkdv = plan.launches[-1]
  assert dkdv.kernel is kbwd.attention_bwd_dkdv_kernel and dkdv.grid == (4, 1)
  kk, vv = (name for name, out in plan.stored_in.items() if out in ("dk", "dv"))
  tensors = dict(do=do, q=q, k=k, v=v, o_for_delta=o_hp, lse=lse, **poisoned(plan, plan.scratch + plan.outputs, device))
  torch_launch.execute(plan, tensors)  # the fast walk: the reference bits
  want = {name: tensors[name].clone() for name in ("dk", "dv")}
  # The plan up to its dK/dV launch leaves fq(K) and fq(V) in dK's and dV's storage; then REDO with two tiles flagged.
  leaks = torch.tensor([[1, 0, 0, 1]], dtype=torch.int32, device=device)
  redo = dataclasses.replace(plan, launches=plan.launches[:-1] + (plans.redo_launch(dkdv, kk, vv),),
                             buffers={**plan.buffers, "dkdv_leaks": torch_launch.describe(leaks)})
  tensors = dict(do=do, q=q, k=k, v=v, o_for_delta=o_hp, lse=lse, dkdv_leaks=leaks,
                 **poisoned(plan, plan.scratch + plan.outputs, device))
  before = dataclasses.replace(plan, launches=plan.launches[:-1])
  torch_launch.execute(before, dict(tensors))
  fq_k, fq_v = tensors["dk"].clone(), tensors["dv"].clone()
  torch_launch.execute(redo, tensors)
  for name, fq in (("dk", fq_k), ("dv", fq_v)):
    got, ref, kept = (_np(x).reshape(4, 16, -1).view(np.uint32) for x in (tensors[name], want[name], fq))
    np.testing.assert_array_equal(got[[0, 3]], ref[[0, 3]], err_msg=f"{name}: the flagged tiles")
    np.testing.assert_array_equal(got[[1, 2]], kept[[1, 2]], err_msg=f"{name}: the other tiles")


@pytest.mark.parametrize("residuals, p_scale", [(False, "block"), (True, "row")])
def test_forward_redo_walks_exactly_the_flagged_row_tiles(residuals, p_scale):
  """The Triton forward's REDO launch (the plan's after the warp-specialized kernel's causal walk), for O alone and
  for the training forward in row mode (O, O', lse and the row max: four outputs in place): where a row tile's flag
  is set it walks that tile exactly and writes its outputs in place (without NaN the exact walk's values are the fast
  walk's, bit for bit); the other tiles keep what the outputs' storage holds. Causal, 40 query rows in three tiles of
  16, 64 keys, GQA; a NaN of V behind the diagonal of the first tile reaches only the rows that see its key."""
  device = kernel_device()
  b, tq, tk, n, kh, d = 1, 40, 64, 2, 1, 32
  to_t = lambda x: torch.from_numpy(np.array(x)).to(torch.bfloat16).to(device)
  q, k, v, _ = (to_t(x) for x in _inputs(b, tq, tk, n, kh, d, "bfloat16"))
  v[0, 10, 0, 3] = float("nan")  # key 10: seen by rows 10 and on (tile 0 holds rows 0-15)
  opts = AttentionOptions(d**-0.5, True, 16, ALL_ON, p_scale=p_scale)
  plan = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), opts, torch_launch.target(q),
                                 config=ForwardConfig(16, 4, 1), residuals=residuals)
  fwd = plan.launches[-1]
  outputs = ("o", "o_hp", "lse", "row_max") if residuals else ("o",)
  assert fwd.kernel is kfwd.attention_fwd_kernel and fwd.grid == (3, 2) and plan.outputs == outputs
  tensors = dict(q=q, k=k, v=v, **poisoned(plan, plan.scratch + plan.outputs, device))
  torch_launch.execute(plan, tensors)  # the fast walk, its exact walk where the NaN leaked: the reference
  want = {name: tensors[name].clone() for name in outputs}
  nan_rows = np.isnan(_np(want["o"])[0, :, 0]).any(axis=-1)  # query head 0 reads KV head 0
  np.testing.assert_array_equal(nan_rows, np.arange(tq) >= 10)
  leaks = torch.tensor([[1, 0, 1], [0, 1, 0]], dtype=torch.int32, device=device)  # [B * N, row tiles]
  redo_launch = plans.forward_redo_launch(fwd)
  assert len(redo_launch.aliases) == len(outputs)
  redo = dataclasses.replace(plan, launches=plan.launches[:-1] + (redo_launch,),
                             buffers={**plan.buffers, "fwd_leaks": torch_launch.describe(leaks)})
  tensors = dict(q=q, k=k, v=v, fwd_leaks=leaks, **poisoned(plan, plan.scratch + plan.outputs, device))
  kept = {name: tensors[name].clone() for name in outputs}
  torch_launch.execute(redo, tensors)
  for name in outputs:
    got, ref, old = (_np(x).view(np.uint32) for x in (tensors[name], want[name], kept[name]))
    if got.ndim == 3:  # lse, row max: [B, N, Tq] -> [B, Tq, N] as O's rows
      got, ref, old = (x.transpose(0, 2, 1) for x in (got, ref, old))
    for head, tiles in ((0, (0, 2)), (1, (1,))):
      for tile in range(3):
        rows = slice(16 * tile, 16 * tile + 16)
        expect = ref if tile in tiles else old
        np.testing.assert_array_equal(got[0, rows, head], expect[0, rows, head],
                                      err_msg=f"{name}, head {head}, tile {tile}")


def test_no_visible_key_gives_zero_and_minus_inf():
  """Tk = 0: every row is empty, so O = O' = 0 and lse = -inf, never NaN."""
  device = kernel_device()
  q = torch.ones((1, 5, 2, 16), dtype=torch.bfloat16, device=device)
  k = torch.ones((1, 0, 1, 16), dtype=torch.bfloat16, device=device)
  o, o_hp, lse = _kernel_forward(q, k, k, scale=0.25, is_causal=True, block_n=16, block_m=16, cfg=ALL_ON)
  assert (_np(o) == 0).all() and (_np(o_hp) == 0).all()
  assert (_np(lse) == -np.inf).all()


def test_fq_blocks_follow_absolute_key_indices_in_dkdv():
  """dV's fq(P) blocks are 16 keys at absolute indices, whatever the dK/dV key tile (16, 32 or 64)."""
  device = kernel_device()
  case = (1, 17, 40, 2, 1, 16, False, "bfloat16", 16, ALL_ON)
  b, tq, tk, n, kh, d, causal, dtype, bn, cfg = case
  to_t = lambda x: torch.from_numpy(np.array(x)).to(_TORCH[dtype]).to(device)
  q, k, v, do = (to_t(x) for x in _inputs(b, tq, tk, n, kh, d, dtype))
  _, _, r_lse, r_ofd, (_, _, r_dv) = _reference(case)
  lse_t = torch.from_numpy(r_lse.copy()).to(device)
  for kv_n in (16, 64):
    _, _, dv = _kernel_backward(do, q, k, v, to_t(r_ofd), lse_t, scale=d**-0.5, is_causal=causal,
                                blocks=(16, 16, 16, kv_n), cfg=cfg)
    assert_close(_np(dv), r_dv, rel=BOUNDS["dV"], name=f"dV (key tile {kv_n})")


def test_launch_configs_fit_every_head_dim():
  for d in (16, 48, 64, 80, 96, 128, 192, 256):  # tiles are padded to the next power of two
    fwd, bwd = kfwd.forward_config(d), kbwd.backward_config(d)
    assert fwd.block_m >= 16 and bwd.kv_block_n % 16 == 0
    # Shared memory of the forward: Q tile plus pipelined K and V tiles, bf16, with BLOCK_N = 64.
    d = triton.next_power_of_2(d)
    smem = 2 * (fwd.block_m * d + fwd.num_stages * 2 * 64 * d)
    assert smem <= 228 * 1024, (d, smem)


def test_fake_quantize_rows_kernel_matches_generic():
  """The attention plans' fq kernel (stride hints) computes nvfp4.fake_quantize_kernel's function."""
  device = kernel_device()
  flags = _flags(device, "bfloat16")
  x = torch.from_numpy(np.random.default_rng(3).standard_normal((37, 64)).astype(np.float32) * 3).to(
      torch.bfloat16).to(device)
  out = _nan_like(x)
  knv.fake_quantize_rows_kernel[(triton.cdiv(37, 16), 1)](x, 37, 64, 64, 64, out, BLOCK_R=16, BLOCK_C=64,
                                                          **_qflags(flags))
  assert torch.equal(out.view(torch.int16), _fq(x, flags).view(torch.int16))


@pytest.mark.parametrize("rows", [(37, 40, 40), (64, 21)], ids=["three", "two"])  # tiles of 32 rows at D = 64
def test_fake_quantize_of_several_tensors_in_one_launch(rows):
  """The pass's one launch over two or three tensors (ragged and whole tiles mixed) gives each tensor what
  fake_quantize_rows_kernel gives it alone, and writes nothing past any tensor's rows."""
  device = kernel_device()
  flags = _flags(device, "bfloat16")
  rng = np.random.default_rng(4)
  xs = [torch.from_numpy(rng.standard_normal((r, 64)).astype(np.float32) * 3).to(torch.bfloat16).to(device)
        for r in rows]
  outs = [_nan_like(torch.empty(r + 16, 64, dtype=torch.bfloat16, device=device)) for r in rows]  # 16 rows to spare
  grid, launch = knv.fake_quantize_many_launch(rows, 64)
  block_r = launch["BLOCK_R"]
  assert grid == (sum(triton.cdiv(r, block_r) for r in rows), 1)
  assert [launch[f"EVEN{i}"] for i in range(len(rows))] == [r % block_r == 0 for r in rows]
  kernel = {2: knv.fake_quantize_rows2_kernel, 3: knv.fake_quantize_rows3_kernel}[len(rows)]
  kernel[grid](*xs, *rows, 64, *outs, **{k: v for k, v in launch.items() if k not in ("num_warps", "num_stages")},
               **_qflags(flags))
  for x, out, r in zip(xs, outs, rows):
    alone = _nan_like(x)
    knv.fake_quantize_rows_kernel[(triton.cdiv(r, 16), 1)](x, r, 64, 64, 64, alone, BLOCK_R=16, BLOCK_C=64,
                                                           **_qflags(flags))
    assert torch.equal(out[:r].view(torch.int16), alone.view(torch.int16))
    want = fq_oracle(_np(x)).astype(np.float32)  # the independent oracle, then bf16 (exact: <= 6 significant bits)
    np.testing.assert_array_equal(_np(out[:r]).astype(np.float32).view(np.uint32), want.view(np.uint32))
    assert torch.isnan(out[r:].float()).all()


def test_launch_config_overrides(monkeypatch):
  """JQAT_ATTN_{FWD,BWD}_CONFIG and set_config_override replace fields of the defaults, for both bindings."""
  assert plans.parse_config("block_m=64, num_warps=4,", "fwd") == {"block_m": 64, "num_warps": 4}
  with pytest.raises(ValueError, match="block_n"):
    plans.parse_config("block_n=32", "fwd")  # block_n changes the function: not a launch knob
  with pytest.raises(ValueError, match="must be an integer"):
    plans.parse_config("block_m=big", "fwd")
  monkeypatch.setenv("JQAT_ATTN_FWD_CONFIG", "block_m=32,num_warps=4")
  try:
    plans.set_config_override("fwd", {"num_stages": 1, "maxnreg": 128})
    assert plans.forward_config(128) == ForwardConfig(32, 4, 1, 128)
    plans.set_config_override("bwd", "kv_num_warps=2,kv_block_n=32")  # neither is a default at D = 128
    bwd = plans.backward_config(128)
    assert (bwd.kv_num_warps, bwd.kv_block_n) == (2, 32)
    assert bwd.dq_block_m == kbwd.backward_config(128).dq_block_m
    # Both bindings execute the plan, so the override reaches a plan built for torch tensors too.
    q = torch.zeros((1, 40, 2, 128), dtype=torch.bfloat16)
    plan = plans.attention_forward(*(torch_launch.describe(q),) * 3, AttentionOptions(0.1), torch_launch.target(q))
    assert plan.launches[-1].grid == (triton.cdiv(40, 32), 2) and plan.launches[-1].num_stages == 1
    assert [x.maxnreg for x in plan.launches] == [0] * (len(plan.launches) - 1) + [128]  # the forward's cap alone
  finally:
    plans.set_config_override("fwd", None)
    plans.set_config_override("bwd", None)
  monkeypatch.delenv("JQAT_ATTN_FWD_CONFIG")
  assert plans.forward_config(128) == kfwd.forward_config(128) and kfwd.forward_config(128).maxnreg == 0


# ----------------------------------------------------------------------------- GPU, through the public API

def _api_inputs(b, tq, tk, n, kh, d, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = jax.random.normal(keys[0], (b, tq, n, d), jnp.float32).astype(jnp.bfloat16)
  k = jax.random.normal(keys[1], (b, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  v = jax.random.normal(keys[2], (b, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  do = jax.random.normal(keys[3], (b, tq, n, d), jnp.float32).astype(jnp.bfloat16)
  return q, k, v, do


# (B, Tq, Tk, N, K, D, causal, config): B*H large and small, Tq = Tk and Tq != Tk, GQA/MQA, every switch.
GPU_CASES = [
    (1, 1, 1, 4, 1, 64, False, ALL_ON),
    (2, 17, 17, 4, 4, 64, True, ALL_ON),
    (1, 17, 1000, 8, 1, 128, False, ALL_ON),
    (1, 1000, 17, 8, 2, 128, True, ALL_ON),
    (1, 128, 1000, 4, 4, 256, True, ALL_ON),
    (1, 1000, 1000, 8, 8, 256, False, QATConfig(quantize_qkv=False)),
    (1, 1000, 1000, 4, 2, 192, False, ALL_ON),  # D > 128 without a mask: the forward reads fq(Q) from the pass
    (4, 128, 128, 16, 2, 128, True, QATConfig(quantize_p=False)),
    (1, 1000, 4096, 4, 1, 64, False, QATConfig(high_precision_delta=False)),
    (1, 4096, 4096, 16, 4, 128, True, ALL_ON),
    (1, 4096, 1000, 8, 8, 64, True, QATConfig(quantize_p_backward=False)),
    (16, 128, 128, 16, 16, 128, False, QATConfig(False, False, False, False)),
    (2, 300, 300, 4, 2, 32, False, ALL_ON),  # D <= 32 without a mask: the forward rounds its own Q tile
    (1, 200, 333, 2, 1, 16, False, ALL_ON),
    # Shapes the warp-specialized dK/dV kernel (the default) takes: no masks, Tk a multiple of 16. WS_DKDV_CASES run
    # once more with the Triton dK/dV kernel (JQAT_ATTN_BWD_KERNEL=triton):
    (2, 256, 384, 8, 2, 128, False, ALL_ON),
    (1, 128, 256, 4, 1, 64, False, ALL_ON),
    (1, 96, 128, 4, 4, 128, False, QATConfig(quantize_qkv=False)),  # dK, dV not over fq(K), fq(V)
    (1, 64, 128, 2, 2, 64, False, QATConfig(high_precision_delta=False)),
    (1, 200, 336, 4, 2, 128, False, ALL_ON),  # lengths the tiles do not divide (Tk a multiple of 16)
    (2, 100, 208, 4, 1, 64, False, ALL_ON),
]
WS_DKDV_CASES = GPU_CASES[-6:]


def _gpu_case_id(case):
  b, tq, tk, n, kh, d, causal, cfg = case
  switches = "".join(str(int(x)) for x in dataclasses.astuple(cfg))
  return f"B{b}-Tq{tq}-Tk{tk}-N{n}K{kh}-D{d}-{'causal' if causal else 'full'}-cfg{switches}"


def _fwd_bwd(impl, q, k, v, do, causal, cfg):
  o, o_hp, lse = jqat.attention_forward(q, k, v, is_causal=causal, implementation=impl, config=cfg)
  o_fd = o_hp if cfg.high_precision_delta else o
  grads = jqat.attention_backward(do, q, k, v, o_fd, lse, is_causal=causal, implementation=impl, config=cfg)
  return (o, o_hp, lse) + tuple(grads)


@pytest.mark.gpu
@pytest.mark.parametrize("case, bwd_kernel", [pytest.param(c, None, id=_gpu_case_id(c)) for c in GPU_CASES]
                         + [pytest.param(c, "triton", id=f"{_gpu_case_id(c)}-bwd_triton") for c in WS_DKDV_CASES])
def test_triton_matches_xla_gpu(case, bwd_kernel, monkeypatch):
  if bwd_kernel:
    monkeypatch.setenv(plans.BWD_KERNEL_ENV, bwd_kernel)
  b, tq, tk, n, kh, d, causal, cfg = case
  q, k, v, do = _api_inputs(b, tq, tk, n, kh, d)
  run = jax.jit(_fwd_bwd, static_argnums=(0, 5, 6))
  got = run("triton", q, k, v, do, causal, cfg)
  want = run("xla", q, k, v, do, causal, cfg)
  for name, a, e in zip(("O", "O'", "lse", "dQ", "dK", "dV"), got, want):
    a, e = np.asarray(a.astype(jnp.float32)), np.asarray(e.astype(jnp.float32))
    if name == "lse":  # compare -inf rows exactly, finite ones with the bound
      assert (np.isneginf(a) == np.isneginf(e)).all()
      a, e = np.where(np.isneginf(e), 0, a), np.where(np.isneginf(e), 0, e)
    assert_close(a, e, rel=BOUNDS[name], name=name)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_triton_is_deterministic_gpu(causal):
  """Bit-equal results from two runs (no atomics); without a mask at 1024 tokens the dK/dV launch is the
  warp-specialized kernel."""
  t = 1000 if causal else 1024
  q, k, v, do = _api_inputs(2, t, t, 8, 2, 128, seed=1)
  run = jax.jit(_fwd_bwd, static_argnums=(0, 5, 6))
  first = run("triton", q, k, v, do, causal, ALL_ON)
  second = run("triton", q, k, v, do, causal, ALL_ON)
  for a, e in zip(first, second):
    assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(e).view(np.uint8))


@pytest.mark.gpu
def test_triton_under_vmap_and_jit_gpu():
  """vmap folds the mapped axis into B: the result equals the per-slice calls."""
  q, k, v, do = _api_inputs(3, 40, 33, 4, 2, 64, seed=2)

  def loss(q, k, v, impl):
    return jnp.sum(jqat.attention(q[None], k[None], v[None], is_causal=True, implementation=impl).astype(jnp.float32)
                   * do[:1].astype(jnp.float32))

  grad = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, 0, 0, None)), static_argnums=3)
  got = grad(q, k, v, "triton")
  for i in range(3):
    one = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)(q[i], k[i], v[i], "triton")
    for a, e in zip(got, one):
      assert np.array_equal(np.asarray(a[i]).view(np.uint16), np.asarray(e).view(np.uint16))
  want = grad(q, k, v, "xla")
  for name, a, e in zip(("dQ", "dK", "dV"), got, want):
    assert_close(np.asarray(a.astype(jnp.float32)), np.asarray(e.astype(jnp.float32)), rel=BOUNDS[name], name=name)


def _gpu_masks(b, tq, tk, kind, seed=0):
  """Keyword masks for the GPU grid: padding, packed documents of random lengths, windows, bottom-right."""
  rng = np.random.default_rng(seed)
  lengths = lambda t: jnp.asarray(rng.integers(0, t + 1, b).astype(np.int32))
  packed = lambda t, size: jnp.asarray(np.arange(t)[None] // size, jnp.int32).repeat(b, 0)  # sorted ids
  shuffled = lambda t: jnp.asarray(rng.integers(0, 4, (b, t)), jnp.int32)  # unsorted: no tile narrowing
  return {
      "lengths": lambda: dict(query_seq_lengths=lengths(tq), key_value_seq_lengths=lengths(tk)),
      "segments": lambda: dict(q_segment_ids=shuffled(tq), kv_segment_ids=shuffled(tk)),
      "causal-segments": lambda: dict(is_causal=True, q_segment_ids=packed(tq, 97), kv_segment_ids=packed(tk, 97)),
      "window": lambda: dict(local_window_size=(200, 31)),
      "causal-window-bottom-right": lambda: dict(is_causal=True, local_window_size=(300, 0),
                                                 causal_alignment="bottom_right"),
      "all": lambda: dict(is_causal=True, local_window_size=(500, 0), causal_alignment="bottom_right",
                          query_seq_lengths=lengths(tq), key_value_seq_lengths=lengths(tk),
                          q_segment_ids=packed(tq, 300), kv_segment_ids=packed(tk, 300)),
  }[kind]()


# (B, Tq, Tk, N, K, D, mask kind): every mask, Tq != Tk both ways, GQA, padded head dims 48, 80, 96, 192.
GPU_MASK_CASES = [
    (2, 1000, 1000, 8, 2, 128, "lengths"),
    (2, 1000, 1000, 4, 4, 64, "segments"),
    (1, 2048, 2048, 8, 1, 128, "causal-segments"),
    (1, 1500, 1500, 4, 2, 96, "window"),
    (2, 300, 1200, 4, 2, 80, "causal-window-bottom-right"),
    (2, 1200, 700, 4, 4, 192, "all"),
    (1, 777, 777, 2, 1, 48, "all"),
    (1, 513, 513, 4, 2, 96, "lengths"),
]


def _masked_fwd_bwd(impl, q, k, v, do, masks):
  o, o_hp, lse = jqat.attention_forward(q, k, v, implementation=impl, **masks)
  grads = jqat.attention_backward(do, q, k, v, o_hp, lse, implementation=impl, **masks)
  return (o, o_hp, lse) + tuple(grads)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_MASK_CASES, ids=lambda c: "-".join(map(str, c)))
def test_triton_masks_match_xla_gpu(case):
  b, tq, tk, n, kh, d, kind = case
  q, k, v, do = _api_inputs(b, tq, tk, n, kh, d, seed=tq + d)
  masks = _gpu_masks(b, tq, tk, kind)
  static = {n: m for n, m in masks.items() if not hasattr(m, "shape")}
  arrays = {n: m for n, m in masks.items() if hasattr(m, "shape")}
  run = jax.jit(lambda impl, q, k, v, do, arrays: _masked_fwd_bwd(impl, q, k, v, do, {**static, **arrays}),
                static_argnums=0)
  got = run("triton", q, k, v, do, arrays)
  want = run("xla", q, k, v, do, arrays)
  for name, a, e in zip(("O", "O'", "lse", "dQ", "dK", "dV"), got, want):
    a, e = np.asarray(a.astype(jnp.float32)), np.asarray(e.astype(jnp.float32))
    assert not np.isnan(a).any(), name
    if name == "lse":  # rows that see no key: -inf on both sides
      assert (np.isneginf(a) == np.isneginf(e)).all()
      a, e = np.where(np.isneginf(e), 0, a), np.where(np.isneginf(e), 0, e)
    assert_close(a, e, rel=BOUNDS[name], name=name)


@pytest.mark.gpu
@pytest.mark.parametrize("causal, t, tk, d, p_scale", [(False, 384, 384, 128, "block"), (True, 384, 384, 128, "block"),
                                                       (False, 200, 150, 128, "block"), (True, 200, 200, 128, "block"),
                                                       (True, 200, 200, 96, "block"), (False, 384, 384, 128, "row"),
                                                       (True, 200, 200, 96, "row")])
def test_ws_forward_through_the_library_gpu(monkeypatch, causal, t, tk, d, p_scale):
  """With ``JQAT_ATTN_FWD_KERNEL=ws`` (the default's choice too without a mask; on causal walks the default takes it
  from WS_CAUSAL_MIN_ROWS rows) O alone through ``jax.jit(jqat.attention)`` and through the torch binding without grad
  comes from the warp-specialized kernel where it takes the plan (GQA, D = 128 and 96, lengths whole tiles or not,
  p_scale "block" and "row"; causal: its causal walk, then the Triton kernel's REDO launch) and is within the Triton
  forward's bound of the XLA reference. A NaN in V reaches exactly the elements of O that the XLA reference makes NaN:
  under the causal mask, not the rows before its key (the diagonal tile's hidden pairs: the REDO launch's exact
  walk)."""
  import jqat.torch as jt
  from jqat.ffi import jax_launch

  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "ws")
  b, n, kh = 1, 6, 3
  target = jax_launch.target()
  if tuple(target.compute_capability or ()) != (9, 0):
    pytest.skip("the warp-specialized forward is sm_90 code")
  dense = plans.Tensor.dense
  plan = plans.attention_forward(dense((b, t, n, d), "bfloat16"), dense((b, tk, kh, d), "bfloat16"),
                                 dense((b, tk, kh, d), "bfloat16"),
                                 AttentionOptions(d**-0.5, is_causal=causal, p_scale=p_scale), target, residuals=False)
  names = [la.name for la in plan.launches]
  assert names[-2:] == ["jqat_attention_fwd_ws", "jqat_attention_fwd_redo"] if causal else (
      names[-1] == "jqat_attention_fwd_ws"), names
  q, k, v, _ = _api_inputs(b, t, tk, n, kh, d, seed=7 + causal)
  run = lambda impl: jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation=impl,
                                                             p_scale=p_scale))
  want = np.asarray(run("xla")(q, k, v).astype(jnp.float32))
  got = np.asarray(run("triton")(q, k, v).astype(jnp.float32))
  assert_close(got, want, rel=BOUNDS["O"], name="O (jax)")
  bhsd = lambda x: torch.from_numpy(np.asarray(x.astype(jnp.float32))).to("cuda", torch.bfloat16).transpose(1, 2)
  with torch.no_grad():
    out = jt.attention(*(bhsd(x).contiguous() for x in (q, k, v)), is_causal=causal, enable_gqa=True, p_scale=p_scale)
  assert_close(out.transpose(1, 2).float().cpu().numpy(), want, rel=BOUNDS["O"], name="O (torch)")
  key = min(200, tk - 1)  # causal: key 200 of KV head 1, behind the diagonal of rows 192..199
  v_nan = v.at[0, key, 1, 5].set(jnp.nan)
  want_nan = np.isnan(np.asarray(run("xla")(q, k, v_nan).astype(jnp.float32)))
  got_nan = np.isnan(np.asarray(run("triton")(q, k, v_nan).astype(jnp.float32)))
  assert want_nan.any() and want_nan[:, :key].any() != causal
  np.testing.assert_array_equal(got_nan, want_nan)


@pytest.mark.gpu
@pytest.mark.parametrize("d, p_scale, t, causal", [(128, "block", 640, False), (64, "block", 640, False),
                                                   (128, "row", 640, False), (64, "row", 640, False),
                                                   (128, "row", 592, False), (64, "row", 592, False),
                                                   (128, "block", 640, True), (128, "row", 592, True),
                                                   (64, "block", 640, True), (96, "block", 640, False),
                                                   (96, "row", 592, False), (96, "block", 640, True)])
def test_ws_dkdv_through_the_library_gpu(monkeypatch, d, p_scale, t, causal):
  """The default dK/dV kernel: dK and dV through ``jax.grad`` of ``jqat.attention`` and through the torch binding
  (BTNH storage) come from the warp-specialized kernel (the backward plan of these shapes launches it: GQA, T a
  multiple of 128, or 592 = 37 * 16, which neither its query nor its key tiles divide; p_scale "block" and "row";
  causal: its causal walk, then the Triton kernel's REDO launch; D = 96 on tiles of 128 channels) and are within the
  Triton backward's bounds of the XLA reference."""
  import jqat.torch as jt
  from jqat.ffi import jax_launch

  monkeypatch.delenv(plans.BWD_KERNEL_ENV, raising=False)
  b, n, kh = 1, 6, 3  # shapes no other test traces: a fresh trace reads the variable
  target = jax_launch.target()
  if tuple(target.compute_capability or ()) != (9, 0):
    pytest.skip("the warp-specialized dK/dV kernel is sm_90 code")
  dense = plans.Tensor.dense
  x, kv = dense((b, t, n, d), "bfloat16"), dense((b, t, kh, d), "bfloat16")
  lse = dense((b, n, t), "float32")
  plan = plans.attention_backward(x, x, kv, kv, x, lse, AttentionOptions(d**-0.5, is_causal=causal, p_scale=p_scale),
                                  target, row_max=lse if p_scale == "row" else None)
  names = [la.name for la in plan.launches]
  assert names[-2:] == ["jqat_attention_bwd_dkdv_ws", "jqat_attention_bwd_dkdv_redo"] if causal else (
      names[-1] == "jqat_attention_bwd_dkdv_ws")
  q, k, v, do = _api_inputs(b, t, t, n, kh, d, seed=11 + d)

  def loss(q, k, v, impl):
    return jnp.sum(jqat.attention(q, k, v, is_causal=causal, implementation=impl, p_scale=p_scale)
                   .astype(jnp.float32) * do.astype(jnp.float32))

  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
  want = [np.asarray(g.astype(jnp.float32)) for g in grad(q, k, v, "xla")]
  for name, a, e in zip(("dQ", "dK", "dV"), grad(q, k, v, "triton"), want):
    assert_close(np.asarray(a.astype(jnp.float32)), e, rel=BOUNDS[name], name=f"{name} (jax)")
  bhsd = lambda x: torch.from_numpy(np.asarray(x.astype(jnp.float32))).to("cuda", torch.bfloat16).transpose(1, 2)
  qt, kt, vt = (bhsd(x).requires_grad_() for x in (q, k, v))  # BTNH storage: heads side by side
  jt.attention(qt, kt, vt, is_causal=causal, enable_gqa=True, p_scale=p_scale).backward(bhsd(do))
  for name, g, e in zip(("dQ", "dK", "dV"), (qt.grad, kt.grad, vt.grad), want):
    assert_close(g.transpose(1, 2).float().cpu().numpy(), e, rel=BOUNDS[name], name=f"{name} (torch)")


@pytest.mark.gpu
def test_triton_masks_under_vmap_gpu():
  """Mask operands lead with B like the rest: vmap folds them into the batch as well."""
  q, k, v, do = _api_inputs(3, 300, 300, 4, 2, 64, seed=5)
  segs = jnp.asarray(np.arange(300)[None] // 70, jnp.int32).repeat(3, 0)
  lens = jnp.array([300, 150, 0], jnp.int32)

  def loss(q, k, v, seg, kvl, impl):
    return jnp.sum(jqat.attention(q[None], k[None], v[None], implementation=impl, q_segment_ids=seg[None],
                                  kv_segment_ids=seg[None], key_value_seq_lengths=kvl[None]).astype(jnp.float32)
                   * do[:1].astype(jnp.float32))

  grad = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, 0, 0, 0, 0, None)), static_argnums=5)
  got = grad(q, k, v, segs, lens, "triton")
  want = grad(q, k, v, segs, lens, "xla")
  for name, a, e in zip(("dQ", "dK", "dV"), got, want):
    assert_close(np.asarray(a.astype(jnp.float32)), np.asarray(e.astype(jnp.float32)), rel=BOUNDS[name], name=name)


def test_row_factors_kernel_matches_float64():
  """p_scale="row": ``attention_bwd_row_factors_kernel`` writes R * l and 1 / (R * l), l = exp(lse - m), per query
  row into [B, N, 2, Tq] (rows without keys: 1 and 0; a NaN lse stays NaN), against float64 NumPy; every element of
  the poisoned output is written, the ragged last block included."""
  device = kernel_device()
  b, n, tq = 2, 3, 700
  gen = torch.Generator().manual_seed(5)
  m = torch.randn(b, n, tq, generator=gen) * 8
  lse = m + torch.rand(b, n, tq, generator=gen) * 9  # lse >= m: l in [1, e^9)
  lse[0, 1, :5] = m[0, 1, :5] = float("-inf")  # rows that see no key
  lse[1, 2, 7] = float("nan")
  rf = torch.full((b, n, 2, tq), float("nan"), device=device)
  block = kbwd.ROW_FACTORS_LAUNCH["BLOCK"]
  kbwd.attention_bwd_row_factors_kernel[(triton.cdiv(b * n * tq, block),)](
      lse.to(device), m.to(device), b * n * tq, tq, rf, P_ROW_RANGE=P_ROW_RANGE, BLOCK=block)
  rf = rf.cpu().double().numpy()
  lse64, m64 = lse.double().numpy(), m.double().numpy()
  empty = lse64 == -np.inf
  with np.errstate(invalid="ignore"):
    rl = np.where(empty, 1.0, np.exp(lse64 - m64) * P_ROW_RANGE)
    inv = np.where(empty, 0.0, 1.0 / rl)
  live = ~np.isnan(lse64)
  np.testing.assert_allclose(rf[:, :, 0][live], rl[live], rtol=2e-6)
  np.testing.assert_allclose(rf[:, :, 1][live], inv[live], rtol=2e-6)
  nan = np.isnan(rf)
  assert nan[1, 2, :, 7].all() and nan.sum() == 2
