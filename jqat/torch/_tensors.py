"""Tensor, device and stream helpers of the torch shim: checks, layouts, DLPack and streams."""

from __future__ import annotations

import contextlib
import functools

import jax
import torch


def check_tensor(name, t):
  if not isinstance(t, torch.Tensor):
    raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_device(name, t, device):
  if t.device != device:
    raise ValueError(f"{name} must be on {device} like the other inputs, got {t.device}")


def check_backend(device):
  """Raises when ``device`` cannot run the jqat.torch kernels (CUDA below sm_80, or a non-CPU/CUDA device)."""
  if device.type == "cpu":
    return
  if device.type != "cuda":
    raise ValueError(f"tensors must be on a CUDA device or the CPU, got {device}")
  _check_cuda_backend(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _check_cuda_backend(index: int) -> None:
  """check_backend of CUDA device ``index``; cached, since a device's capability and triton's presence do not change
  within a process (and a prepared op checks at every call)."""
  cc = torch.cuda.get_device_capability(index)
  if cc < (8, 0):
    raise RuntimeError(f"the jqat kernels need compute capability >= 8.0 (Ampere); cuda:{index} has {cc[0]}.{cc[1]}")
  try:
    import triton  # noqa: F401, PLC0415
  except ImportError as e:  # pragma: no cover
    raise RuntimeError(f"triton is needed for CUDA tensors ({e})") from None


def check_output(name, t, like, inputs, *, contiguous=False):
  """An output buffer the kernels write in place: ``like``'s shape, dtype and device, contiguous (else dense: no
  element written twice), not requiring grad, overlapping none of ``inputs`` ((name, tensor) pairs)."""
  check_tensor(name, t)
  check_device(name, t, like.device)
  if tuple(t.shape) != tuple(like.shape) or t.dtype != like.dtype:
    raise ValueError(f"{name} must be {like.dtype} of shape {tuple(like.shape)}, got {t.dtype} {tuple(t.shape)}")
  if not (t.is_contiguous() if contiguous else is_dense(t)):  # a layout not taken (torch's convention)
    raise NotImplementedError(f"{name} must be {'contiguous' if contiguous else 'dense with a contiguous last axis'}, "
                              f"got strides {tuple(t.stride())}")
  if t.requires_grad:
    raise ValueError(f"{name} must not require grad (it is written in place)")
  for in_name, x in inputs:
    if overlap(t, x):
      raise ValueError(f"{name} overlaps {in_name}: output buffers must not alias inputs")


def span(t):
  """Byte range ``[lo, hi)`` of the storage ``t`` can touch (None when empty)."""
  if t.numel() == 0:
    return None
  extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
  return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def overlap(a, b) -> bool:
  if a.device != b.device:
    return False
  sa, sb = span(a), span(b)
  return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def is_dense(t) -> bool:
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


def dense(t):
  """``t`` if the kernels can read it in place (dense, last axis contiguous, 16-byte aligned: the forward reads
  K and V by TMA, which needs aligned base addresses), else a copy: with t's strides where t is dense (so that
  outputs allocated like t, ``torch.empty_like``, have the strides of the operand the kernels read), else
  contiguous."""
  if not is_dense(t):
    return t.clone(memory_format=torch.contiguous_format)
  return t if t.data_ptr() % 16 == 0 else torch.empty_like(t).copy_(t)


def readable(t):
  """``t`` if the kernels can read it in place as an input (last axis contiguous, every other stride of an axis
  longer than 1 a multiple of 16 elements, which the kernels assume when they index, 16-byte aligned), else a
  contiguous copy. Gaps and repeated elements are fine to read; an output must be :func:`is_dense`."""
  ok = (t.dim() > 0 and t.stride(-1) == 1 and t.data_ptr() % 16 == 0
        and all(s % 16 == 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n != 1))
  return t if ok else t.clone(memory_format=torch.contiguous_format)


def btnh(t):
  """A BHSD tensor as the BTNH view the kernels take (and back: the transposition is its own inverse)."""
  return t.transpose(1, 2)


def to_jax(t):
  t = t.detach()
  return jax.dlpack.from_dlpack(t if t.numel() == 0 or is_dense(t) else t.contiguous())


def from_jax(a):
  return torch.utils.dlpack.from_dlpack(jax.block_until_ready(a))


def stream_handle(current_stream) -> int:
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


@contextlib.contextmanager
def on_stream(current_stream, device):
  """Makes ``current_stream`` (or torch's current stream) current on ``device`` for the launches inside."""
  if device.type != "cuda":
    if current_stream is not None:
      stream_handle(current_stream)  # validated; CPU work is synchronous and ignores it
    yield
    return
  with torch.cuda.device(device):
    if current_stream is None:
      yield
    else:
      stream = current_stream if isinstance(current_stream, torch.cuda.Stream) else \
          torch.cuda.ExternalStream(stream_handle(current_stream), device=device)
      with torch.cuda.stream(stream):
        yield
