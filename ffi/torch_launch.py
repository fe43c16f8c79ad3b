"""The torch binding: executes launch plans (``jqat.ffi.plan``) on torch tensors with Triton's own launcher.

Launches run on torch's *current* CUDA stream (Triton asks torch for it at every
launch), so callers pick the stream with ``torch.cuda.stream(...)``. Nothing here
allocates unless asked to (:func:`allocate`), except that for a kernel that makes
tensor descriptors (the forward) Triton's launcher takes the launch's global scratch
(128 bytes per descriptor and program) from torch's caching allocator; :func:`carve`
lays a plan's scratch buffers into a caller's workspace. Tensors are passed with their
own strides: a BHSD tensor viewed as BTNH (``x.transpose(1, 2)``) needs no copy.

Under ``TRITON_INTERPRET=1`` (or for CPU tensors) the plan targets the interpreter, so
this binding can be tested on a CPU machine.
"""

from __future__ import annotations

import contextvars
import os

import torch
import triton

from jqat.ffi import interpreter
from jqat.ffi import plan as plans

_WS_ALIGN = 256  # byte alignment of every buffer carved out of a workspace


def interpreting(x) -> bool:
  return os.environ.get("TRITON_INTERPRET", "0") == "1" or x.device.type != "cuda"


def target(x) -> plans.Target:
  """The plan target of tensor ``x``'s device (the interpreter for CPU tensors)."""
  if interpreting(x):
    return plans.Target(None, interpret=True)
  return plans.Target(tuple(torch.cuda.get_device_capability(x.device)))


def describe(x) -> plans.Tensor:
  """``x`` as a plan tensor: shape, dtype name and element strides."""
  return plans.Tensor(tuple(x.shape), str(x.dtype).removeprefix("torch."), tuple(x.stride()))


def _dtype(name: str):
  return getattr(torch, name)


def _storage_elements(t: plans.Tensor) -> int:
  return 0 if t.size == 0 else sum((s - 1) * st for s, st in zip(t.shape, t.strides)) + 1


def allocate(plan: plans.Plan, names, device) -> dict:
  """New tensors for the buffers ``names``, with the plan's shapes, dtypes and strides."""
  return {n: torch.empty_strided(plan.buffers[n].shape, plan.buffers[n].strides, dtype=_dtype(plan.buffers[n].dtype),
                                 device=device) for n in names}


def workspace_bytes(plan: plans.Plan) -> int:
  """Bytes of a workspace holding the plan's scratch buffers, each at a 256-byte aligned offset."""
  return sum(_aligned_bytes(plan.buffers[n]) for n in plan.scratch)


def _aligned_bytes(t: plans.Tensor) -> int:
  nbytes = _storage_elements(t) * _dtype(t.dtype).itemsize
  return -(-nbytes // _WS_ALIGN) * _WS_ALIGN


def carve(plan: plans.Plan, workspace) -> dict:
  """The plan's scratch buffers as views into ``workspace`` (1-D uint8, at least :func:`workspace_bytes`)."""
  views, off = {}, 0
  for name in plan.scratch:
    t = plan.buffers[name]
    dtype = _dtype(t.dtype)
    n = _storage_elements(t)
    flat = workspace[off:off + n * dtype.itemsize].view(dtype)
    views[name] = flat.as_strided(t.shape, t.strides)
    off += _aligned_bytes(t)
  return views


def execute(plan: plans.Plan, tensors: dict, *, warmup: bool = False) -> None:
  """Runs ``plan`` with ``tensors``: every buffer it names (inputs, scratch and outputs) by name; each buffer
  of ``plan.stored_in`` is the tensor of the buffer it is stored in.

  warmup: compile every kernel without launching anything (Triton ``warmup``; a no-op for the interpreter).
  """
  tensors = {**tensors, **{name: tensors[out] for name, out in plan.stored_in.items()}}
  for name, value in plan.fills.items():
    if not warmup:
      tensors[name].fill_(value)
  # Kernels that make tensor descriptors need Triton's global scratch, which its launcher takes from the allocator
  # set in the current context: torch's caching allocator here, set in a copy of the context (the caller's stays).
  contextvars.copy_context().run(_launch_all, plan, tensors, warmup)


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
  """Triton's global scratch of one launch: freed to torch's cache when the launch returns, reused in stream order
  (the launch runs on torch's current stream, the caching allocator's stream for this block)."""
  del stream  # torch's current stream, the launch's
  if alignment > 512:  # torch's CUDA blocks are 512-byte aligned
    raise ValueError(f"Triton asked for scratch aligned to {alignment} bytes; torch's allocator gives 512")
  return torch.empty(size, dtype=torch.uint8, device="cuda")  # the current device: callers set the tensors'


def _launch_all(plan: plans.Plan, tensors: dict, warmup: bool) -> None:
  triton.set_allocator(_scratch)
  if plan.launches and interpreting(tensors[plan.inputs[0]]):
    interpreter.install()
  for launch in plan.launches:
    args = tuple(tensors[a.name] if isinstance(a, plans.Ref) else a for a in launch.args)
    args += tuple(tensors[o] for o in launch.outputs)
    kwargs = dict(launch.constexprs, **launch.options())
    if warmup:
      if not interpreting(args[0]):
        launch.kernel.warmup(*args, grid=launch.grid, **kwargs)
    else:
      launch.kernel[launch.grid](*args, **kwargs)
