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


def workspace_offsets(plan: plans.Plan) -> dict:
  """Byte offset in the workspace of each of the plan's scratch buffers (256-byte aligned, in plan order)."""
  offsets, off = {}, 0
  for name in plan.scratch:
    offsets[name] = off
    off += _aligned_bytes(plan.buffers[name])
  return offsets


def carve(plan: plans.Plan, workspace) -> dict:
  """The plan's scratch buffers as views into ``workspace`` (1-D uint8, at least :func:`workspace_bytes`)."""
  views = {}
  for name, off in workspace_offsets(plan).items():
    t = plan.buffers[name]
    dtype = _dtype(t.dtype)
    n = _storage_elements(t)
    flat = workspace[off:off + n * dtype.itemsize].view(dtype)
    views[name] = flat.as_strided(t.shape, t.strides)
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


def launch(kernel, grid, args: tuple, kwargs: dict) -> None:
  """One launch of ``kernel`` outside a plan (a benchmark's variant of a kernel), on torch's current stream, with
  Triton's global scratch from torch's caching allocator as :func:`execute` gives it."""

  def run():
    triton.set_allocator(_scratch)
    kernel[grid](*args, **kwargs)

  contextvars.copy_context().run(run)


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


class Address:
  """A device address as Triton's launcher takes a buffer (an object with ``data_ptr()``): a buffer at an offset of a
  workspace, without the tensor view that would be an operation on the stream's tensors."""

  __slots__ = ("ptr",)

  def __init__(self, ptr: int):
    self.ptr = ptr

  def data_ptr(self) -> int:
    return self.ptr


class Prepared:
  """The launches of a plan compiled ahead of execution, launched without Triton's JIT dispatch: no specialization
  lookup, no compilation, no tensor operation; each launch is one kernel launch on torch's current stream (so it can
  be captured in a CUDA graph as that kernel alone).

  Each launch is compiled once per ``variants`` entry: "aligned" (every pointer 16-byte aligned, the specialization of
  the JAX binding) and "any" (no pointer assumed aligned). Integer arguments are never specialized (not on their
  divisibility, nor on a value of 1), so the same kernels take any token count; they are typed int32, and
  :meth:`launch` refuses values outside it. Compiled for the plan's device (the current CUDA device), modules loaded.
  """

  def __init__(self, plan: plans.Plan, target: plans.Target, variants=("aligned",)):
    from jqat.ffi import callback_launch  # noqa: PLC0415  (triton.compile with an explicit specialization)

    self.plan = plan
    self.kernels = []  # per launch: {variant: CompiledKernel}, and the constexpr values after its arguments
    for launch in plan.launches:
      types = tuple(_arg_type(plan, a) for a in launch.args) + tuple(
          "*" + callback_launch._POINTER_TYPES[plan.buffers[o].dtype] for o in launch.outputs)
      compiled = {}
      for variant in variants:
        kernel = callback_launch.build(launch.kernel, types, (), tuple(launch.constexprs.items()), launch.num_warps,
                                       launch.num_stages, target.compute_capability, launch.maxnreg,
                                       aligned=variant == "aligned")
        if kernel.metadata.global_scratch_size:  # Triton would allocate it at each launch
          raise NotImplementedError(f"{launch.name}: a prepared launch cannot take Triton's global scratch")
        kernel._init_handles()  # the module is loaded now, not at the first launch (nor under graph capture)
        compiled[variant] = kernel
      n = len(launch.args) + len(launch.outputs)
      self.kernels.append((compiled, tuple(launch.constexprs[p] for p in launch.kernel.arg_names[n:])))

  def launch(self, index: int, grid: tuple, args: tuple, variant: str = "aligned") -> None:
    """Launch ``index`` of the plan with ``args`` (its arguments and outputs in kernel order: tensors or
    :class:`Address` for buffers, ints and floats for scalars) over ``grid``."""
    compiled, constexprs = self.kernels[index]
    for a in args:
      if isinstance(a, int) and not -2**31 <= a < 2**31:
        raise ValueError(f"{self.plan.launches[index].name}: an integer argument of {a} does not fit the prepared "
                         "kernel's int32")
    compiled[variant][tuple(grid) + (1,) * (3 - len(grid))](*args, *constexprs)


def _arg_type(plan: plans.Plan, a) -> str:
  from jqat.ffi import callback_launch  # noqa: PLC0415

  if isinstance(a, plans.Ref):
    return "*" + callback_launch._POINTER_TYPES[plan.buffers[a.name].dtype]
  if isinstance(a, float):
    return "fp32"
  if isinstance(a, int) and not isinstance(a, bool):
    return "i32"
  raise TypeError(f"kernel scalars must be int or float, got {type(a).__name__} {a!r}")
