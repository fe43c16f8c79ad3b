"""PyTorch front end of jqat: QAT attention and tail RoPE + QDQ on torch tensors (SPEC section 5).

Layout is BHSD, as in ``torch.nn.functional.scaled_dot_product_attention``:
``q [B, H, Sq, D]``, ``k, v [B, Hkv, Skv, D]``, ``lse [B, H, Sq]`` fp32.

Where the work runs:

- CUDA tensors: the very kernels of ``kernels_triton`` (the ones the JAX API
  runs inside XLA) are launched on the torch tensors themselves by
  ``ffi.torch_launch``, on torch's current CUDA stream, or on ``current_stream``
  when given. BHSD tensors are passed as strided BTNH views
  (``x.transpose(1, 2)``): no host copies, no extra device copies. Outputs and
  scratch are allocated by torch's caching allocator on the stream the work is
  ordered on, so a buffer torch frees after a call is only handed out again to
  work queued after it on that stream.
- CPU tensors: the tensors go through DLPack to the pure-JAX (XLA) reference of
  ``jqat`` and back, so the results are those of ``jqat.attention_forward`` /
  ``attention_backward`` / ``rope_qdq`` with ``implementation="xla"``, bit for
  bit. This path is not zero-copy (XLA writes new buffers; the BHSD <-> BTNH
  transposes are copies there).

Entry points:

- :func:`attention` -- differentiable, like ``F.scaled_dot_product_attention``.
- The vendor API names: :func:`nvfp4_attention_qat_forward`,
  :func:`nvfp4_attention_qat_backward`, :class:`Nvfp4AttentionQatBackward`,
  :func:`rope_qdq_inplace`, :class:`RopeQDQInplace`.

``current_stream`` everywhere accepts a ``torch.cuda.Stream`` (or
``ExternalStream``), a raw ``cudaStream_t`` handle as an int, an object with a
``cuda_stream`` attribute or ``int()`` conversion (e.g. ``cuda.CUstream``), or
None for torch's current stream. The caller orders the producers of the inputs
before that stream and keeps the inputs alive until the work finishes (as for any
torch op on a side stream).
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import torch

import jqat
from jqat._src import rope_qdq as _rope_api
from jqat._src.attention import DEFAULT_BLOCK_N
from jqat._src.attention_reference import QATConfig

__all__ = [
    "Nvfp4AttentionQatBackward", "RopeQDQInplace", "TupleDict", "attention", "nvfp4_attention_qat_backward",
    "nvfp4_attention_qat_forward", "rope_qdq_inplace",
]

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_WS_ALIGN = 256  # byte alignment of every view carved out of a workspace


class TupleDict(dict):
  """A dict that also unpacks like a tuple of its values, in insertion order.

  ``result["dq_tensor"]`` works as for a dict; ``dq, dk, dv = result``, ``list(result)``
  and ``result[0]`` give the values (iteration yields values, not keys; use
  ``result.keys()`` / ``result.items()`` for the keys).
  """

  def __iter__(self):
    return iter(self.values())

  def __getitem__(self, key):
    if isinstance(key, int):
      return list(self.values())[key]
    return super().__getitem__(key)


# ----------------------------------------------------------------------------- shared helpers

def _launcher():
  from ffi import torch_launch  # noqa: PLC0415  (imports triton; only needed on CUDA)

  return torch_launch


def _stream_handle(current_stream) -> int:
  if isinstance(current_stream, torch.cuda.Stream):
    return current_stream.cuda_stream
  handle = getattr(current_stream, "cuda_stream", current_stream)
  if isinstance(handle, (bool, str, bytes, float)):
    handle = None
  try:
    return int(handle)
  except (TypeError, ValueError):
    raise TypeError("current_stream must be None, a torch.cuda.Stream, a raw CUDA stream handle (int) or an "
                    f"object convertible to one, got {type(current_stream).__name__}") from None


def _as_stream(current_stream, device):
  if isinstance(current_stream, torch.cuda.Stream):
    return current_stream
  return torch.cuda.ExternalStream(_stream_handle(current_stream), device=device)


@contextlib.contextmanager
def _on_stream(current_stream, device):
  """Makes ``current_stream`` (or torch's current stream) current on ``device`` for the launches inside."""
  if device.type != "cuda":
    if current_stream is not None:
      _stream_handle(current_stream)  # validated; CPU work is synchronous and ignores it
    yield
    return
  with torch.cuda.device(device):
    if current_stream is None:
      yield
    else:
      with torch.cuda.stream(_as_stream(current_stream, device)):
        yield


def _span(t):
  """Byte range ``[lo, hi)`` of the storage ``t`` can touch (None when empty)."""
  if t.numel() == 0:
    return None
  extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
  return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _overlap(a, b) -> bool:
  if a.device != b.device:
    return False
  sa, sb = _span(a), _span(b)
  return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def _check_tensor(name, t):
  if not isinstance(t, torch.Tensor):
    raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_device(name, t, device):
  if t.device != device:
    raise ValueError(f"{name} must be on {device} like the other inputs, got {t.device}")


def _check_backend(device):
  """Raises when ``device`` cannot run the jqat.torch kernels (CUDA below sm_80, or a non-CPU/CUDA device)."""
  if device.type == "cpu":
    return
  if device.type != "cuda":
    raise ValueError(f"tensors must be on a CUDA device or the CPU, got {device}")
  cc = torch.cuda.get_device_capability(device)
  if cc < (8, 0):
    raise RuntimeError(f"the jqat kernels need compute capability >= 8.0 (Ampere); {device} has {cc[0]}.{cc[1]}")
  try:
    import triton  # noqa: F401, PLC0415
  except ImportError as e:  # pragma: no cover
    raise RuntimeError(f"triton is needed for CUDA tensors ({e})") from None


def _is_dense(t) -> bool:
  """Dense (no gaps, no overlap, non-negative strides) with a contiguous last axis: what both the kernels
  (as rows of D) and JAX's DLPack import (a transposition of a compact buffer) take without a copy."""
  if t.dim() == 0 or t.stride(-1) != 1:
    return False
  expect = 1
  for stride, size in sorted((t.stride(i), t.size(i)) for i in range(t.dim()) if t.size(i) != 1):
    if stride != expect:
      return False
    expect *= size
  return True


def _to_jax(t):
  t = t.detach()
  return jax.dlpack.from_dlpack(t if t.numel() == 0 or _is_dense(t) else t.contiguous())


def _from_jax(a):
  return torch.utils.dlpack.from_dlpack(jax.block_until_ready(a))


def _btnh(t):
  return t.transpose(1, 2)


def _dense(t):
  """``t`` if the kernels can read it in place (dense, last axis contiguous), else a contiguous copy."""
  return t if _is_dense(t) else t.contiguous()


def _last_contig(t):
  return t if t.stride(-1) == 1 else t.contiguous()


@functools.lru_cache(maxsize=None)
def _xla_forward(**static):
  """``jqat.attention_forward`` (XLA reference) on BHSD arrays, jitted once per static configuration."""
  def fn(q, k, v):
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
    return jqat.attention_forward(q, k, v, implementation="xla", **static)
  return jax.jit(fn)


@functools.lru_cache(maxsize=None)
def _xla_backward(**static):
  """``jqat.attention_backward`` (XLA reference) on BHSD arrays, jitted once per static configuration."""
  def fn(do, q, k, v, o_for_delta, lse):
    do, q, k, v, o_for_delta = (jnp.swapaxes(t, 1, 2) for t in (do, q, k, v, o_for_delta))
    return jqat.attention_backward(do, q, k, v, o_for_delta, lse, implementation="xla", **static)
  return jax.jit(fn)


def _scale(scale, d):
  return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _check_attention(q, k, v, *, enable_gqa: bool, block_n: int = DEFAULT_BLOCK_N, names=("q", "k", "v")):
  """SPEC section 6 checks of BHSD q, k, v; raises naming the argument, what was expected and what was given."""
  for name, t in zip(names, (q, k, v)):
    _check_tensor(name, t)
    if t.dim() != 4:
      raise ValueError(f"{name} must have rank 4 [B, H, S, D], got shape {tuple(t.shape)}")
    if t.dtype not in _FLOATS:
      raise TypeError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
  nq, nk, nv = names
  if not q.dtype == k.dtype == v.dtype:
    raise TypeError(f"{nq}, {nk} and {nv} must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
  _check_device(nk, k, q.device)
  _check_device(nv, v, q.device)
  _check_backend(q.device)
  b, h, _, d = q.shape
  if tuple(v.shape) != tuple(k.shape):
    raise ValueError(f"{nv} must have the shape of {nk} {tuple(k.shape)}, got {tuple(v.shape)}")
  if k.shape[0] != b:
    raise ValueError(f"{nk} batch must equal {nq} batch {b}, got {k.shape[0]}")
  if k.shape[3] != d:
    raise ValueError(f"{nk} head dim must equal {nq} head dim {d}, got {k.shape[3]}")
  if d % 16 or d == 0:
    raise ValueError(f"{nq} head dim must be a positive multiple of 16 (NVFP4 blocks), got {d}")
  hkv = k.shape[1]
  if enable_gqa:
    if hkv == 0 or h % hkv:
      raise ValueError(f"{nq} heads ({h}) must be a multiple of {nk}/{nv} heads ({hkv}) with enable_gqa=True")
  elif h != hkv:
    raise ValueError(f"{nq} heads ({h}) must equal {nk}/{nv} heads ({hkv}); pass enable_gqa=True for GQA/MQA")
  if isinstance(block_n, bool) or int(block_n) != block_n or block_n <= 0 or block_n % 16:
    raise ValueError(f"block_n must be a positive multiple of 16, got {block_n!r}")


# ----------------------------------------------------------------------------- attention: the two paths

def _forward(q, k, v, *, scale, is_causal, block_n, cfg: QATConfig):
  """BHSD q, k, v -> BHSD O, O' and lse [B, H, Sq] fp32 (validated inputs, current stream)."""
  if q.device.type == "cpu":
    fn = _xla_forward(scale=scale, is_causal=is_causal, block_n=block_n, config=cfg)
    o, o_hp, lse = fn(*(_to_jax(t) for t in (q, k, v)))
    return _btnh(_from_jax(o)), _btnh(_from_jax(o_hp)), _from_jax(lse)
  q, k, v = _dense(q), _dense(k), _dense(v)
  b, h, sq, d = q.shape
  o = torch.empty((b, h, sq, d), dtype=q.dtype, device=q.device)
  o_hp = torch.empty_like(o)
  lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
  k_hat = v_hat = None
  if cfg.quantize_qkv:
    k_hat = torch.empty_strided(k.shape, k.stride(), dtype=k.dtype, device=k.device)
    v_hat = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
  _launcher().attention_forward(
      _btnh(q), _btnh(k), _btnh(v), _btnh(o), _btnh(o_hp), lse, k_hat if k_hat is None else _btnh(k_hat),
      v_hat if v_hat is None else _btnh(v_hat), scale=scale, is_causal=is_causal, block_n=block_n,
      quantize_qkv=cfg.quantize_qkv, quantize_p=cfg.quantize_p)
  return o, o_hp, lse


def _backward(do, q, k, v, o_for_delta, lse, *, scale, is_causal, cfg: QATConfig, out=None):
  """BHSD gradients (dq, dk, dv) of validated inputs; ``out``: optional (dq, dk, dv) BHSD buffers to write."""
  if q.device.type == "cpu":
    fn = _xla_backward(scale=scale, is_causal=is_causal, config=cfg)
    grads = fn(*(_to_jax(t) for t in (do, q, k, v, o_for_delta, lse)))
    grads = tuple(_btnh(_from_jax(g)) for g in grads)
    if out is None:
      return grads
    for dst, src in zip(out, grads):
      dst.copy_(src)
    return tuple(out)
  q, k, v = _dense(q), _dense(k), _dense(v)
  do, o_for_delta, lse = _last_contig(do), _last_contig(o_for_delta), lse.contiguous()
  if out is None:
    out = tuple(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))
  dq, dk, dv = out
  b, h, sq, _ = q.shape
  delta = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
  hats = [None, None, None]
  if cfg.quantize_qkv:
    hats = [_btnh(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)) for t in (q, k, v)]
  _launcher().attention_backward(
      _btnh(do), _btnh(q), _btnh(k), _btnh(v), _btnh(o_for_delta), lse, _btnh(dq), _btnh(dk), _btnh(dv), delta,
      *hats, scale=scale, is_causal=is_causal, quantize_qkv=cfg.quantize_qkv,
      quantize_p_backward=cfg.quantize_p_backward)
  return dq, dk, dv


class _AttentionFn(torch.autograd.Function):
  """O = QAT attention; backward = SPEC section 3 (straight-through for Q, K, V)."""

  @staticmethod
  def forward(ctx, q, k, v, scale, is_causal, block_n, cfg):
    o, o_hp, lse = _forward(q, k, v, scale=scale, is_causal=is_causal, block_n=block_n, cfg=cfg)
    ctx.save_for_backward(q, k, v, o_hp if cfg.high_precision_delta else o, lse)
    ctx.opts = (scale, is_causal, cfg)
    return o

  @staticmethod
  def backward(ctx, do):
    q, k, v, o_for_delta, lse = ctx.saved_tensors
    scale, is_causal, cfg = ctx.opts
    if not any(ctx.needs_input_grad[:3]):
      return (None,) * 7
    dq, dk, dv = _backward(do, q, k, v, o_for_delta, lse, scale=scale, is_causal=is_causal, cfg=cfg)
    needs = ctx.needs_input_grad
    return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None, None, None, None, None)


@torch.compiler.disable
def attention(q, k, v, is_causal=False, scale=None, enable_gqa=False, *, block_n=DEFAULT_BLOCK_N,
              quantize_qkv=True, quantize_p=True, high_precision_delta=True, quantize_p_backward=True):
  """NVFP4 quantization-aware-training attention (Attn-QAT) on BHSD tensors, differentiable.

  Drop-in for ``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=..., enable_gqa=...)``
  without ``attn_mask`` / ``dropout_p``.

  q: [B, H, Sq, D]; k, v: [B, Hkv, Skv, D]; bf16 (fp16/fp32 accepted); D % 16 == 0.
  Without ``enable_gqa`` H must equal Hkv; with it H % Hkv == 0 (query head h reads KV head h // (H // Hkv)).
  is_causal: top-left aligned (key j visible to query i iff j <= i), as in JAX and SDPA.
  scale: softmax scale, default 1/sqrt(D).
  block_n: KV tile of the forward (the quantized P depends on it), as in ``jqat.attention``.
  quantize_qkv, quantize_p, high_precision_delta, quantize_p_backward: the paper's ablation
    switches (SPEC section 3); all False is plain BF16 flash attention.

  Returns O [B, H, Sq, D] in q's dtype. CUDA tensors run the Triton kernels on the current
  stream; CPU tensors run the JAX reference through DLPack (bit-identical to ``jqat.attention``
  with ``implementation="xla"``).

  ``torch.compile``: this function is excluded from tracing (``torch.compiler.disable``), so a
  compiled module that calls it runs it eagerly behind a graph break; forward and backward work.
  """
  _check_attention(q, k, v, enable_gqa=bool(enable_gqa), block_n=block_n)
  cfg = QATConfig(bool(quantize_qkv), bool(quantize_p), bool(high_precision_delta), bool(quantize_p_backward))
  return _AttentionFn.apply(q, k, v, _scale(scale, q.shape[-1]), bool(is_causal), int(block_n), cfg)


# ----------------------------------------------------------------------------- vendor API: attention

def nvfp4_attention_qat_forward(q, k, v, is_causal=False, softmax_scale=None, current_stream=None):
  """The QAT forward with the auxiliaries the backward needs: ``(o, high_precision_o, lse)``.

  q: [B, H, Sq, D]; k, v: [B, Hkv, Skv, D] (H % Hkv == 0); o, high_precision_o: [B, H, Sq, D]
  contiguous in q's dtype; lse: [B, H, Sq] fp32 (natural log, -inf for a row without keys).
  ``high_precision_o`` is O' = softmax(Q_fake K_fake^T) @ V_fake before probability fake
  quantization, the ``high_precision_o`` of :func:`nvfp4_attention_qat_backward`.
  """
  _check_attention(q, k, v, enable_gqa=True)
  scale = _scale(softmax_scale, q.shape[-1])
  with _on_stream(current_stream, q.device):
    o, o_hp, lse = _forward(q, k, v, scale=scale, is_causal=bool(is_causal), block_n=DEFAULT_BLOCK_N,
                            cfg=QATConfig())
  if q.device.type == "cpu":  # contiguous BHSD like the CUDA path (copies; the CPU path is not zero-copy)
    o, o_hp = o.contiguous(), o_hp.contiguous()
  return o, o_hp, lse


_BWD_NAMES = ("q_tensor", "k_tensor", "v_tensor", "high_precision_o_tensor", "do_tensor", "lse_tensor")


def _check_backward_inputs(q, k, v, high_precision_o, do, lse, *, contiguous=True):
  _check_attention(q, k, v, enable_gqa=True, names=_BWD_NAMES[:3])
  for name, t in (("high_precision_o_tensor", high_precision_o), ("do_tensor", do), ("lse_tensor", lse)):
    _check_tensor(name, t)
    _check_device(name, t, q.device)
  for name, t in (("high_precision_o_tensor", high_precision_o), ("do_tensor", do)):
    if tuple(t.shape) != tuple(q.shape):
      raise ValueError(f"{name} must have the shape of q_tensor {tuple(q.shape)}, got {tuple(t.shape)}")
    if t.dtype != q.dtype:
      raise TypeError(f"{name} must have the dtype of q_tensor ({q.dtype}), got {t.dtype}")
  want = tuple(q.shape[:3])
  if tuple(lse.shape) != want or lse.dtype != torch.float32:
    raise ValueError(f"lse_tensor must be float32 of shape {want} [B, H, S_q], got {lse.dtype} {tuple(lse.shape)}")
  if contiguous:
    for name, t in zip(_BWD_NAMES, (q, k, v, high_precision_o, do, lse)):
      if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous BHSD storage, got strides {tuple(t.stride())}")


def _check_grad_buffers(inputs, grads):
  """dq/dk/dv: contiguous, the shape, dtype and device of q/k/v, overlapping no input and no other output."""
  q, k, v = inputs[:3]
  for name, g, like in zip(("dq_tensor", "dk_tensor", "dv_tensor"), grads, (q, k, v)):
    _check_tensor(name, g)
    _check_device(name, g, q.device)
    if tuple(g.shape) != tuple(like.shape) or g.dtype != like.dtype:
      raise ValueError(f"{name} must be {like.dtype} of shape {tuple(like.shape)}, got {g.dtype} {tuple(g.shape)}")
    if not g.is_contiguous():
      raise ValueError(f"{name} must be contiguous, got strides {tuple(g.stride())}")
    if g.requires_grad:
      raise ValueError(f"{name} must not require grad (it is written in place)")
    for in_name, t in zip(_BWD_NAMES, inputs):
      if _overlap(g, t):
        raise ValueError(f"{name} overlaps {in_name}: output buffers must not alias inputs")
  names = ("dq_tensor", "dk_tensor", "dv_tensor")
  for i in range(3):
    for j in range(i + 1, 3):
      if _overlap(grads[i], grads[j]):
        raise ValueError(f"{names[j]} overlaps {names[i]}")


class Nvfp4AttentionQatBackward:
  """Prepared NVFP4 attention QAT backward (vendor class API).

  ``op = Nvfp4AttentionQatBackward(q, k, v, high_precision_o, do, lse, is_causal=False, softmax_scale=None)``
  plans for those shapes, dtypes and device; ``check_support()`` validates (raises naming
  the argument; returns True); ``compile()`` compiles every kernel the plan launches without
  launching it (Triton ``warmup``); ``scratch_workspace_bytes()`` is the size of the 1-D
  ``torch.uint8`` workspace ``execute`` needs (delta [B, H, Sq] fp32 plus fq(Q), fq(K), fq(V),
  each at a 256-byte aligned offset); ``execute(...)`` writes dq, dk, dv into the caller's
  contiguous buffers and allocates nothing on CUDA. On CPU tensors ``execute`` runs the JAX
  reference (which allocates its own buffers) and copies the results into dq, dk, dv.

  Supports more than the vendor page: H % Hkv == 0 (GQA/MQA), any D % 16 == 0, fp16/fp32,
  causal with Sq != Skv (top-left aligned), Hopper and Ampere.
  """

  def __init__(self, q, k, v, high_precision_o, do, lse, is_causal=False, softmax_scale=None):
    self._planned = (q, k, v, high_precision_o, do, lse)
    self.is_causal = bool(is_causal)
    self.softmax_scale = softmax_scale
    self._checked = False

  def check_support(self):
    q, k, v, o_hp, do, lse = self._planned
    _check_backward_inputs(q, k, v, o_hp, do, lse)
    self.device, self.dtype = q.device, q.dtype
    self.q_shape, self.kv_shape = tuple(q.shape), tuple(k.shape)
    self.scale = _scale(self.softmax_scale, q.shape[-1])
    self._checked = True
    return True

  def _require_checked(self):
    if not self._checked:
      self.check_support()

  def _layout(self):
    """[(offset, dtype, shape)] of delta, fq(Q), fq(K), fq(V) in the workspace, and its total size."""
    self._require_checked()
    b, h, sq, _ = self.q_shape
    parts, off = [], 0
    for dtype, shape in ((torch.float32, (b, h, sq)), (self.dtype, self.q_shape), (self.dtype, self.kv_shape),
                         (self.dtype, self.kv_shape)):
      parts.append((off, dtype, shape))
      nbytes = math.prod(shape) * dtype.itemsize
      off += -(-nbytes // _WS_ALIGN) * _WS_ALIGN
    return parts, off

  def scratch_workspace_bytes(self) -> int:
    return self._layout()[1]

  def _carve(self, workspace):
    return [workspace[off:off + math.prod(shape) * dtype.itemsize]
            .view(dtype).view(shape) for off, dtype, shape in self._layout()[0]]

  def compile(self):
    """Compiles (CUDA: Triton warmup, nothing launched) every kernel of the plan; no-op on CPU."""
    self._require_checked()
    if self.device.type != "cuda":
      return self
    q, k, v, o_hp, do, lse = self._planned
    # Stand-ins for the buffers execute() receives: same dtype, shape and (torch-allocator) alignment.
    with torch.cuda.device(self.device):
      delta, qh, kh, vh = (torch.empty(s, dtype=dt, device=self.device) for _, dt, s in self._layout()[0])
      _launcher().attention_backward(
          _btnh(do), _btnh(q), _btnh(k), _btnh(v), _btnh(o_hp), lse, _btnh(qh), _btnh(kh), _btnh(vh), delta,
          _btnh(qh), _btnh(kh), _btnh(vh), scale=self.scale, is_causal=self.is_causal, quantize_qkv=True,
          quantize_p_backward=True, warmup=True)
    return self

  def execute(self, q, k, v, high_precision_o, do, lse, dq, dk, dv, workspace, current_stream=None):
    """Writes dQ, dK, dV into ``dq``, ``dk``, ``dv`` (contiguous, shaped like q, k, v); no allocation on CUDA."""
    self._require_checked()
    _check_backward_inputs(q, k, v, high_precision_o, do, lse)
    if q.device != self.device or q.dtype != self.dtype or tuple(q.shape) != self.q_shape \
        or tuple(k.shape) != self.kv_shape:
      raise ValueError(f"q_tensor/k_tensor must match the plan ({self.dtype} {self.q_shape}, {self.kv_shape} on "
                       f"{self.device}), got {q.dtype} {tuple(q.shape)}, {tuple(k.shape)} on {q.device}")
    inputs = (q, k, v, high_precision_o, do, lse)
    _check_grad_buffers(inputs, (dq, dk, dv))
    need = self.scratch_workspace_bytes()
    _check_tensor("workspace", workspace)
    if workspace.dtype != torch.uint8 or workspace.dim() != 1 or workspace.numel() < need:
      raise ValueError(f"workspace must be a 1-D torch.uint8 tensor of at least {need} bytes, got {workspace.dtype} "
                       f"{tuple(workspace.shape)}")
    _check_device("workspace", workspace, self.device)
    if not workspace.is_contiguous() or workspace.data_ptr() % 16:
      raise ValueError("workspace must be contiguous and 16-byte aligned, got data_ptr "
                       f"{workspace.data_ptr():#x}, stride {workspace.stride()}")
    for name, t in zip(_BWD_NAMES + ("dq_tensor", "dk_tensor", "dv_tensor"), inputs + (dq, dk, dv)):
      if _overlap(workspace, t):
        raise ValueError(f"workspace overlaps {name}")
    with _on_stream(current_stream, self.device):
      if self.device.type == "cpu":
        _backward(do, q, k, v, high_precision_o, lse, scale=self.scale, is_causal=self.is_causal, cfg=QATConfig(),
                  out=(dq, dk, dv))
        return dq, dk, dv
      delta, qh, kh, vh = self._carve(workspace)
      _launcher().attention_backward(
          _btnh(do), _btnh(q), _btnh(k), _btnh(v), _btnh(high_precision_o), lse, _btnh(dq), _btnh(dk), _btnh(dv),
          delta, _btnh(qh), _btnh(kh), _btnh(vh), scale=self.scale, is_causal=self.is_causal, quantize_qkv=True,
          quantize_p_backward=True)
    return dq, dk, dv


def nvfp4_attention_qat_backward(do, q, k, v, high_precision_o, lse, is_causal=False, softmax_scale=None,
                                 dq_tensor=None, dk_tensor=None, dv_tensor=None, current_stream=None):
  """dQ, dK, dV of NVFP4 QAT attention (vendor wrapper): ``TupleDict(dq_tensor=, dk_tensor=, dv_tensor=)``.

  BHSD contiguous tensors: q, do, high_precision_o [B, H, Sq, D]; k, v [B, Hkv, Skv, D];
  lse [B, H, Sq] fp32 from :func:`nvfp4_attention_qat_forward`. ``dq, dk, dv = result`` and
  ``result["dq_tensor"]`` both work. Preallocated dq/dk/dv tensors are written in place;
  missing ones (and the workspace) are allocated on the stream the work runs on.
  """
  _check_backward_inputs(q, k, v, high_precision_o, do, lse)
  op = Nvfp4AttentionQatBackward(q, k, v, high_precision_o, do, lse, is_causal=is_causal,
                                 softmax_scale=softmax_scale)
  op.check_support()
  with _on_stream(current_stream, q.device):
    grads = [g if g is not None else torch.empty_like(like, memory_format=torch.contiguous_format)
             for g, like in zip((dq_tensor, dk_tensor, dv_tensor), (q, k, v))]
    _check_grad_buffers((q, k, v, high_precision_o, do, lse), grads)
    if q.device.type == "cpu":
      workspace = torch.empty(0, dtype=torch.uint8)
      _backward(do, q, k, v, high_precision_o, lse, scale=op.scale, is_causal=op.is_causal, cfg=QATConfig(),
                out=grads)
    else:
      workspace = torch.empty(op.scratch_workspace_bytes(), dtype=torch.uint8, device=q.device)
      op.execute(q, k, v, high_precision_o, do, lse, *grads, workspace)
  del workspace
  return TupleDict(dq_tensor=grads[0], dk_tensor=grads[1], dv_tensor=grads[2])


# ----------------------------------------------------------------------------- vendor API: RoPE + QDQ

def _check_rope(x, cache, positions, mode):
  """Static checks of rope_qdq_inplace (SPEC section 6); nothing is touched on failure."""
  for name, t in (("x", x), ("cache", cache), ("positions", positions)):
    _check_tensor(name, t)
    if t.requires_grad:
      raise ValueError(f"{name} must not require grad: rope_qdq_inplace mutates x and has no backward")
  _rope_api.check_arrays(x, cache, positions, mode)
  _check_device("cache", cache, x.device)
  _check_device("positions", positions, x.device)
  _check_backend(x.device)
  for name, t in (("x", x), ("cache", cache), ("positions", positions)):
    if not t.is_contiguous():
      raise ValueError(f"{name} must be contiguous, got shape {tuple(t.shape)} with strides {tuple(t.stride())}")
  for name, t in (("cache", cache), ("positions", positions)):
    if _overlap(x, t):
      raise ValueError(f"x overlaps {name}: x is written in place and must not share storage with its inputs")
  n_rows = x.numel() // mode.width
  if n_rows >= 2**31:
    raise ValueError(f"x has {n_rows} rows of {mode.width}; at most 2**31 - 1 are supported")


class RopeQDQInplace:
  """Prepared tail RoPE + microscaled QDQ written over ``x`` (vendor class API).

  ``op = RopeQDQInplace(x, cache, positions, quantization="fp4", group_size=32, scale_format="ue8m0",
  backend="frost")``; ``check_support()`` validates (returns True); ``compile()`` compiles the
  kernel for the plan without launching it (CUDA; no-op on CPU); ``scratch_workspace_bytes()``
  is 0; ``execute(x, cache, positions, current_stream=None)`` mutates x's storage. The plan
  accepts new token counts, leading dims, cache lengths and positions; the mode, the group-32
  FP4 head count, the positions dtype and the device stay fixed.

  CUDA: one kernel launch, no allocation, no synchronization (a new shape may compile a
  new Triton specialization on first use). CPU: the JAX reference computes a new buffer
  (through DLPack) that is then copied into x with ``x.copy_`` -- not zero-copy.
  """

  def __init__(self, x, cache, positions, quantization="fp4", group_size=32, scale_format="ue8m0",
               backend="frost"):
    if backend != "frost":
      raise ValueError(f"backend must be 'frost' (the only backend), got {backend!r}")
    self.mode = _rope_api._mode(quantization, group_size, scale_format)
    self.quantization, self.group_size, self.scale_format = quantization, int(group_size), scale_format
    self._planned = (x, cache, positions)
    self._checked = False

  def check_support(self):
    x, cache, positions = self._planned
    _check_rope(x, cache, positions, self.mode)
    self.device, self.pos_dtype = x.device, positions.dtype
    self.heads = x.shape[1] if self.mode.per_token else 1
    self._checked = True
    return True

  def scratch_workspace_bytes(self) -> int:
    return 0

  def _kw(self, heads):
    m = self.mode
    return dict(heads=heads, width=m.width, group=m.group, fp8=m.fp8, e4m3_scale=m.e4m3_scale, amax_floor=m.floor)

  def compile(self):
    if not self._checked:
      self.check_support()
    if self.device.type == "cuda":
      x, cache, positions = self._planned
      with torch.cuda.device(self.device):
        _launcher().rope_qdq_inplace(x, cache, positions, warmup=True, **self._kw(self.heads))
    return self

  def _check_execute(self, x, cache, positions):
    if not self._checked:
      self.check_support()
    _check_rope(x, cache, positions, self.mode)
    if x.device != self.device:
      raise ValueError(f"x must be on the planned device {self.device}, got {x.device}")
    if positions.dtype != self.pos_dtype:
      raise TypeError(f"positions must have the planned dtype {self.pos_dtype}, got {positions.dtype}")
    if self.mode.per_token and x.shape[1] != self.heads:
      raise ValueError(f"x must have the planned head count {self.heads} (x.shape[1]), got {x.shape[1]}")

  def execute(self, x, cache, positions, current_stream=None):
    self._check_execute(x, cache, positions)
    self._run(x, cache, positions, current_stream)
    return x

  def _run(self, x, cache, positions, current_stream):
    if x.numel() == 0:
      return
    if x.device.type == "cpu":
      # JAX without x64 narrows int64 by wrapping: clamp into [0, P) first, as the kernel does.
      positions = positions.clamp(0, cache.shape[0] - 1).to(torch.int32)
      out = jqat.rope_qdq(_to_jax(x), _to_jax(cache), _to_jax(positions), quantization=self.quantization,
                          group_size=self.group_size, scale_format=self.scale_format, implementation="xla")
      x.copy_(_from_jax(out))
      return
    with _on_stream(current_stream, x.device):
      _launcher().rope_qdq_inplace(x, cache, positions.reshape(-1), **self._kw(x.shape[1] if self.mode.per_token
                                                                                else 1))


def rope_qdq_inplace(x, cache, positions, quantization="fp4", group_size=32, scale_format="ue8m0",
                     current_stream=None):
  """Tail RoPE on the last 64 channels + microscaled QDQ of every channel, written over ``x``.

  x: contiguous bf16 [N, H, 128] (fp4/32/ue8m0) or [..., 512] (fp8/32/ue8m0, fp4/16/e4m3);
  cache: contiguous fp32 [P, 64] (32 cosines then 32 sines); positions: contiguous int32/int64,
  one id per token ([N]) for group-32 FP4, else one per 512-channel row (x.shape[:-1] or flat).
  Returns ``TupleDict(out=x)``: ``result["out"] is x``. Every check runs before anything is
  launched, and x is untouched when one fails. CUDA: in place, on the current (or given)
  stream. CPU: JAX reference through DLPack, then ``x.copy_`` (not zero-copy).
  """
  op = RopeQDQInplace(x, cache, positions, quantization=quantization, group_size=group_size,
                      scale_format=scale_format)
  op.check_support()
  op._run(x, cache, positions, current_stream)
  return TupleDict(out=x)
