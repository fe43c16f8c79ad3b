"""Shared test inputs and one runner per attention implementation: a case is written once and run on each backend.

Implementations (``implementations()`` makes the pytest parameters, with their skip rules):
  "xla"          the pure-JAX reference through the public API (``implementation="xla"``), jitted.
  "interpreter"  the Triton kernels in Triton's interpreter (``TRITON_INTERPRET=1``, CPU only): the launch plans
                 (``jqat.ffi.plan``) executed by the torch launcher on CPU tensors, every buffer poisoned first.
  "triton"       the compiled Triton kernels through the public API (``implementation="triton"``): GPU only.
  "torch"        ``jqat.torch.attention`` with autograd (CUDA kernels on a GPU, the XLA reference through DLPack on
                 the CPU); it returns O and the gradients only.

The kernels run with small tiles (``FORWARD_CONFIG``, ``BACKWARD_CONFIG``) so that cases of a few dozen rows and keys
cross several tiles of every kind (skipped, masked, unmasked): the interpreter's cost grows with the element count.
Results are float64 NumPy dicts keyed ``O, O', lse[, row_max], dQ, dK, dV`` in the JAX layouts (BTNH; lse [B, N, Tq]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import HAS_GPU
from oracle import E4M3_VALUES, visible_oracle

import jqat
from jqat import nvfp4
from jqat._src import validate
from jqat.kernels_triton.attention_bwd import BackwardConfig
from jqat.kernels_triton.attention_fwd import ForwardConfig

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
NAMES = ("O", "O'", "lse", "row_max", "dQ", "dK", "dV")
FORWARD_CONFIG = ForwardConfig(16, 4, 1)  # 16 query rows a program
BACKWARD_CONFIG = BackwardConfig(16, 16, 4, 1, 32, 16, 4, 1)  # dQ: 16 x 16 tiles; dK/dV: 32 keys x 16 rows

KERNELS = ("interpreter", "triton")
# Kernels against the XLA reference on the same inputs: exp2 vs exp last-bit differences, occasionally flipping an fq
# code (the bounds of tests/test_attention_triton.py).
KERNEL_BOUNDS = {"O": 2e-3, "O'": 5e-4, "lse": 1e-5, "row_max": 1e-5, "dQ": 1e-3, "dK": 1e-3, "dV": 2e-3}

_MARKS = {"xla": (), "torch": (), "triton": (pytest.mark.gpu,),
          "interpreter": (pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter runs on CPU machines"),)}


def implementations(*names: str, slow: tuple[str, ...] = ()) -> list:
  """pytest parameters for ``implementation`` (all four by default); those in ``slow`` also get the
  ``slow_interpreter`` marker (cases of the interpreter that take seconds each: ``-m "not slow_interpreter"``
  leaves them out of a quick local run, the CI suite runs them)."""
  out = []
  for name in names or tuple(_MARKS):
    marks = _MARKS[name] + ((pytest.mark.slow_interpreter,) if name in slow else ())
    out.append(pytest.param(name, marks=marks, id=name))
  return out


# ----------------------------------------------------------------------------- inputs


def qkv(shape, seed: int = 0, *, spread=(1.0, 1.0, 1.0, 1.0), dtype=jnp.bfloat16):
  """Random q, k, v, dO for ``shape = (B, Tq, Tk, N, K, D)``: normal with standard deviations ``spread``, rounded to
  ``dtype`` (JAX arrays, BTNH)."""
  b, tq, tk, n, kh, d = shape
  rng = np.random.default_rng(seed)
  shapes = ((b, tq, n, d), (b, tk, kh, d), (b, tk, kh, d), (b, tq, n, d))
  return tuple(jnp.asarray(rng.normal(0, s, sh).astype(np.float32), dtype) for s, sh in zip(spread, shapes))


def poison(x, index):
  """``x`` with a NaN at ``index``."""
  return x.at[index].set(jnp.nan)


def nan_of(x) -> np.ndarray:
  return np.isnan(np.asarray(x, np.float32))


def f64(x) -> np.ndarray:
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


@dataclasses.dataclass(frozen=True, eq=False)
class Masks:
  """Mask operands of one case, in the public keywords' meaning; the integer operands as NumPy int32 (or None)."""

  is_causal: bool = False
  window: int | tuple[int, int] | None = None
  bottom_right: bool = False
  q_len: np.ndarray | None = None
  kv_len: np.ndarray | None = None
  q_seg: np.ndarray | None = None
  kv_seg: np.ndarray | None = None

  def operands(self) -> tuple:
    """(query_seq_lengths, key_value_seq_lengths, q_segment_ids, kv_segment_ids), None where absent."""
    return tuple(None if x is None else np.asarray(x, np.int32) for x in (self.q_len, self.kv_len, self.q_seg,
                                                                           self.kv_seg))

  def static(self) -> dict:
    """The keywords that are not arrays."""
    return dict(is_causal=self.is_causal, local_window_size=self.window,
                causal_alignment="bottom_right" if self.bottom_right else "top_left")

  def keywords(self, to=jnp.asarray) -> dict:
    """Public keywords of jqat.attention (or, with ``to`` a torch converter, of jqat.torch.attention)."""
    return {**self.static(), **{n: to(x) for n, x in zip(validate.MASK_NAMES, self.operands()) if x is not None}}

  def visible(self, b: int, tq: int, tk: int) -> np.ndarray:
    """[B, Tq, Tk] bool from the oracle's element-by-element rule."""
    window = (self.window, self.window) if isinstance(self.window, int) else self.window
    return visible_oracle(b, tq, tk, is_causal=self.is_causal, window=window, bottom_right=self.bottom_right,
                          q_len=self.q_len, kv_len=self.kv_len, q_seg=self.q_seg, kv_seg=self.kv_seg)


NO_MASKS = Masks()


def lengths(q_len, kv_len, **kw) -> Masks:
  return Masks(q_len=np.asarray(q_len, np.int32), kv_len=np.asarray(kv_len, np.int32), **kw)


def segments(q_seg, kv_seg, **kw) -> Masks:
  """Segment ids from run lengths per batch row: ``[[(id, count), ...], ...]``."""
  ids = lambda rows: np.stack([np.repeat([i for i, _ in r], [c for _, c in r]) for r in rows]).astype(np.int32)
  return Masks(q_seg=ids(q_seg), kv_seg=ids(kv_seg), **kw)


def mask_set(b: int, tq: int, tk: int, *, unsorted: bool = False) -> tuple:
  """Lengths and packed (sorted) segment ids for [b = 2, tq, tk] with a segment no key has; ``unsorted``: ids out of
  order in batch element 1 (the kernels must not narrow a tile's range by binary search there)."""
  assert b == 2 and tq >= 31 and tk >= 36
  q_len = np.array([tq, 20], np.int32)
  kv_len = np.array([30, tk], np.int32)
  q_seg = np.stack([np.repeat([0, 1, 2], [10, 15, tq - 25]), np.repeat([0, 1, 2], [5, 25, tq - 30])]).astype(np.int32)
  kv_seg = np.stack([np.repeat([0, 1, 3], [12, 20, tk - 32]), np.repeat([0, 1, 2], [5, 30, tk - 35])]).astype(np.int32)
  if unsorted:
    q_seg[1] = np.repeat([2, 0, 1, 2], [5, 10, 12, tq - 27])
    kv_seg[1] = np.repeat([1, 0, 2, 1], [4, 20, 7, tk - 31])
  return q_len, kv_len, q_seg, kv_seg


# ----------------------------------------------------------------------------- numerics modes (QAT switch sets)

# Public keywords beyond the masks: the four QAT switches, p_scale and qkv_scale (docs/NUMERICS.md).
MODES = {
    "block": {},
    "row": dict(p_scale="row"),
    "tensor": dict(qkv_scale="tensor"),
    "no-fq-p": dict(quantize_p=False, quantize_p_backward=False),
    "off": dict(quantize_qkv=False, quantize_p=False, high_precision_delta=True, quantize_p_backward=False),
}
SWITCHES = ("quantize_qkv", "quantize_p", "high_precision_delta", "quantize_p_backward")


def split_mode(mode: dict) -> tuple[jqat.QATConfig, dict]:
  """(the QATConfig of the switches, the other keywords) for attention_forward / attention_backward."""
  cfg = jqat.QATConfig(**{n: mode[n] for n in SWITCHES if n in mode})
  return cfg, {n: x for n, x in mode.items() if n not in SWITCHES}


def options(masks: Masks, mode: dict, *, scale, block_n: int, head_dim: int):
  """The validated AttentionOptions of a case (what the bindings build from the public keywords)."""
  cfg, rest = split_mode(mode)
  if rest.get("smooth_k"):
    raise ValueError("smooth_k is an API-level transform: run it through 'xla', 'triton' or 'torch'")
  return validate.attention_options(scale=scale, is_causal=masks.is_causal, block_n=block_n, head_dim=head_dim,
                                    config=cfg, local_window_size=masks.window,
                                    causal_alignment=masks.static()["causal_alignment"],
                                    p_scale=rest.get("p_scale", "block"), qkv_scale=rest.get("qkv_scale", "block"))


# ----------------------------------------------------------------------------- runners


@contextlib.contextmanager
def kernel_configs(fwd, bwd):
  """Launch configurations for the bindings (read when a plan is built, i.e. when a function traces); None: the
  defaults for the head dim."""
  from jqat.ffi import plan as plans

  plans.set_config_override("fwd", fwd)
  plans.set_config_override("bwd", bwd)
  try:
    yield
  finally:
    plans.set_config_override("fwd", None)
    plans.set_config_override("bwd", None)


@functools.cache
def _jax_chain(implementation: str, static: tuple, present: tuple, mode: tuple, scale, block_n: int, configs):
  """jit(forward outputs of attention_forward, and jax.vjp of jqat.attention at dO): the public differentiation
  path. Cached by everything static, so a poisoned and a clean run of one case share one compile."""
  static, mode = dict(static), dict(mode)
  cfg, rest = split_mode(mode)

  def run(q, k, v, do, *arrays):
    kw = dict(static, **dict(zip(present, arrays)), scale=scale, implementation=implementation)
    fwd = jqat.attention_forward(q, k, v, block_n=block_n, config=cfg, **rest, **kw)
    out, vjp = jax.vjp(lambda q, k, v: jqat.attention(q, k, v, block_n=block_n, **mode, **kw), q, k, v)
    return fwd, vjp(do.astype(out.dtype))

  return jax.jit(run)


def _jax_run(implementation, q, k, v, do, masks, mode, scale, block_n, configs):
  ops = {n: x for n, x in zip(validate.MASK_NAMES, masks.operands()) if x is not None}
  fn = _jax_chain(implementation, tuple(masks.static().items()), tuple(ops), tuple(mode.items()), scale, block_n,
                  configs)
  with kernel_configs(*configs) if implementation == "triton" else contextlib.nullcontext():
    fwd, grads = fn(q, k, v, do, *(jnp.asarray(x) for x in ops.values()))
  names = NAMES[:len(fwd)] if len(fwd) == 4 else ("O", "O'", "lse")
  return {**dict(zip(names, map(f64, fwd))), **dict(zip(("dQ", "dK", "dV"), map(f64, grads)))}


def poisoned(plan, names, device):
  """Plan buffers filled with NaN (integer ones with -1): an element a kernel forgets to write stays so."""
  from jqat.ffi import torch_launch

  tensors = torch_launch.allocate(plan, names, device)
  for t in tensors.values():
    t.fill_(float("nan") if t.is_floating_point() else -1)
  return tensors


def _to_torch(x):
  import torch

  return torch.from_numpy(np.array(jnp.asarray(x, jnp.float32))).to(getattr(torch, jnp.dtype(x.dtype).name))


def _interpreted(q, k, v, do, masks, mode, scale, block_n, configs, scratch):
  """The forward plan, then the backward plan fed the forward's O', lse (and row_max), on CPU tensors."""
  import torch

  from jqat.ffi import plan as plans
  from jqat.ffi import torch_launch

  opts = options(masks, mode, scale=scale, block_n=block_n, head_dim=q.shape[-1])
  qt, kt, vt, dot = map(_to_torch, (q, k, v, do))
  ops = tuple(None if x is None else torch.from_numpy(x) for x in masks.operands())
  described = tuple(None if x is None else torch_launch.describe(x) for x in ops)
  named = {n: x for n, x in zip(("q_len", "kv_len", "q_seg", "kv_seg"), ops) if x is not None}
  plan = plans.attention_forward(*map(torch_launch.describe, (qt, kt, vt)), opts, torch_launch.target(qt),
                                 config=configs[0], masks=described)
  t = dict(q=qt, k=kt, v=vt, **named, **poisoned(plan, plan.scratch + plan.outputs, "cpu"))
  torch_launch.execute(plan, t)
  if scratch is not None:  # fq(K), fq(V) (and, qkv_scale="tensor", the encode scales)
    scratch.update((n, t[n].float().numpy()) for n in plan.scratch)
  o, o_hp, lse, m = (t.get(n) for n in ("o", "o_hp", "lse", "row_max"))
  plan = plans.attention_backward(*map(torch_launch.describe, (dot, qt, kt, vt, o_hp, lse)), opts,
                                  torch_launch.target(qt), config=configs[1], masks=described,
                                  row_max=None if m is None else torch_launch.describe(m))
  tb = dict(do=dot, q=qt, k=kt, v=vt, o_for_delta=o_hp, lse=lse, **({} if m is None else dict(row_max=m)), **named,
            **poisoned(plan, plan.scratch + plan.outputs, "cpu"))
  torch_launch.execute(plan, tb)
  if scratch is not None:  # fq(Q), its encode scale, delta (the backward's fq(K), fq(V) live in dK's, dV's storage)
    scratch.update((n, tb[n].float().numpy()) for n in plan.scratch)
  out = dict(zip(NAMES, (o, o_hp, lse, m, tb["dq"], tb["dk"], tb["dv"])))
  return {n: x.float().numpy().astype(np.float64) for n, x in out.items() if x is not None}


def _torch_run(q, k, v, do, masks, mode, scale, block_n, configs):
  import torch

  import jqat.torch

  device = "cuda" if HAS_GPU and torch.cuda.is_available() else "cpu"
  bhsd = lambda x: _to_torch(jnp.swapaxes(x, 1, 2)).to(device)
  leaves = [bhsd(x).requires_grad_() for x in (q, k, v)]
  kw = masks.keywords(lambda x: torch.from_numpy(x).to(device))
  with kernel_configs(*configs):
    out = jqat.torch.attention(*leaves, scale=scale, enable_gqa=True, block_n=block_n, **mode, **kw)
    out.backward(bhsd(do))
  btnh = lambda t: np.swapaxes(t.detach().float().cpu().numpy().astype(np.float64), 1, 2)
  return dict(zip(("O", "dQ", "dK", "dV"), map(btnh, (out, *(x.grad for x in leaves)))))


def run(implementation: str, q, k, v, do, masks: Masks = NO_MASKS, mode: dict | None = None, *, scale=None,
        block_n: int = 16, fwd: ForwardConfig | None = FORWARD_CONFIG, bwd: BackwardConfig | None = BACKWARD_CONFIG,
        scratch: dict | None = None) -> dict:
  """Forward outputs and gradients (at cotangent ``do``) of one case on ``implementation``: float64 dicts.

  mode: public keywords beyond the masks (``MODES``' values, or e.g. ``dict(smooth_k=True)``); fwd, bwd: the kernels'
  launch configurations (None: the bindings' defaults for the head dim, large tiles: fewer interpreted programs for
  long sequences); scratch (interpreter only): a dict that receives the plans' scratch buffers.
  """
  mode, configs = dict(mode or {}), (fwd, bwd)
  if implementation == "interpreter":
    return _interpreted(q, k, v, do, masks, mode, scale, block_n, configs, scratch)
  if implementation == "torch":
    return _torch_run(q, k, v, do, masks, mode, scale, block_n, configs)
  if implementation in ("xla", "triton"):
    return _jax_run(implementation, q, k, v, do, masks, mode, scale, block_n, configs)
  raise ValueError(f"implementation must be one of {tuple(_MARKS)}, got {implementation!r}")


def zero_empty_rows(results: dict, *others: dict) -> None:
  """lse and row_max are -inf on rows that see no key: assert the same rows in every result, then set them to 0
  so that the relative bounds apply to the rest."""
  for key in ("lse", "row_max"):
    if key not in results:
      continue
    empty = np.isneginf(results[key])
    for d in (results, *others):
      if key in d:
        assert (np.isneginf(d[key]) == empty).all(), f"{key}: -inf on different rows"
        d[key] = np.where(empty, 0.0, d[key])


# ----------------------------------------------------------------------------- quantizer inputs

_FQ = jax.jit(nvfp4.fake_quantize)


def all_bf16_patterns():
  """All 65536 bf16 bit patterns as FP32, [4096, 16]: each block a run of neighbouring patterns."""
  u = np.arange(65536, dtype=np.uint32) << 16
  return u.view(np.float32).reshape(4096, 16)


def all_bf16_patterns_shuffled():
  """The same patterns in random blocks, so small values share blocks with large ones."""
  x = all_bf16_patterns().reshape(-1)
  x = x[np.random.default_rng(0).permutation(x.size)]
  x = x[~np.isnan(x)]  # a NaN would turn its whole block NaN and hide the rest
  return x[: x.size // 16 * 16].reshape(-1, 16)


def boundary_blocks(toward):
  """For every E4M3 scale s (with 6s finite), a block of 16: 6s (so the block's scale is s), the seven
  exact E2M1 boundaries b*s, their FP32 neighbours in the direction of ``toward``, and 0."""
  rows = []
  for s in E4M3_VALUES[1:]:
    s = np.float32(s)
    if s * 6 > 3e38:
      continue
    vals = [np.float32(s * b) for b in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)]
    rows.append([np.float32(6 * s)] + vals + [np.nextafter(v, np.float32(toward)) for v in vals] + [0.0])
  return np.array(rows, np.float32)


def e2m1_midpoints():
  """Exact E2M1 boundaries b*s (and their float neighbours) for every E4M3 scale of a block with amax 6s."""
  x = boundary_blocks(np.inf)
  return np.concatenate([x, -x])


def special_blocks():
  """Zero blocks, +-0, amax > 2688, Inf, NaN-in-block, the 0.5859375 / 0.46875 midpoint."""
  blocks = np.zeros((8, 16), np.float32)
  blocks[1, :] = -0.0
  blocks[1, 3] = 0.0
  blocks[2, :8] = [1e5, -3000.0, 2689.0, 1.0, -1.0, 0.1, -0.1, -0.0]
  blocks[3, :4] = [np.inf, 1.0, -np.inf, -0.0]
  blocks[4, :3] = [np.nan, 1.0, -2.0]
  blocks[5, :2] = [0.5859375, 2.8125]  # amax 2.8125 -> scale 0.46875; 0.5859375/0.46875 = 1.25 -> 1.0
  blocks[6, :3] = [3e38, -3e38, 1e-40]
  blocks[7, :] = np.float32(2.0**-12) * np.arange(16)
  return blocks


# name: (builder of FP32 values, the dtype they are representable in and run as).
FQ_CASES = {
    "all_bf16_patterns": (all_bf16_patterns, "bfloat16"),
    "all_bf16_patterns_shuffled": (all_bf16_patterns_shuffled, "bfloat16"),
    "midpoints_fp32": (e2m1_midpoints, "float32"),
    "special_bf16": (special_blocks, "bfloat16"),
    "special_fp32": (special_blocks, "float32"),
    "special_fp16": (lambda: np.clip(special_blocks(), -60000, 60000), "float16"),
    "random_fp32_tail": (lambda: np.random.default_rng(1).standard_normal((5, 37)).astype(np.float32) * 3, "float32"),
    "random_fp16_tail": (lambda: np.random.default_rng(2).standard_normal((3, 90)).astype(np.float32), "float16"),
    "single_element": (lambda: np.array([[-0.3]], np.float32), "bfloat16"),
}


def fake_quantize(implementation: str, x32: np.ndarray, dtype: str, flags=None) -> np.ndarray:
  """fq along the last axis of ``x32`` (FP32 values representable in ``dtype``) on ``implementation``: the public
  ``jqat.nvfp4.fake_quantize`` ("xla") or the Triton kernel (interpreter / compiled; ``flags``: its E4M3 / E2M1
  paths, else ``quant_flags`` of the device), as FP32. The kernel's output starts as NaN: every element must be
  written."""
  if implementation == "xla":
    return np.asarray(_FQ(jnp.asarray(x32, dtype)), np.float32)
  import torch
  import triton

  from jqat.kernels_triton import nvfp4 as knv

  device = "cpu" if implementation == "interpreter" else "cuda"
  if flags is None:
    flags = knv.quant_flags(None if device == "cpu" else torch.cuda.get_device_capability(), interpret=device == "cpu")
  x = torch.from_numpy(np.ascontiguousarray(x32, np.float32)).to(getattr(torch, dtype)).to(device)
  x2 = x.reshape(-1, x.shape[-1])
  out = torch.full_like(x2, float("nan"))
  rows, cols = x2.shape
  block_c = min(128, max(16, triton.next_power_of_2(cols)))
  grid = (triton.cdiv(rows, 16), triton.cdiv(cols, block_c))
  knv.fake_quantize_kernel[grid](x2, rows, cols, x2.stride(0), out.stride(0), out, BLOCK_R=16, BLOCK_C=block_c,
                                 **flags)
  return out.reshape(x.shape).cpu().float().numpy()
