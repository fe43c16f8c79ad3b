"""An opt-in JAX executor of launch plans: Triton's compiled kernels launched from cubin inside a
``jax.experimental.buffer_callback``, on XLA's stream.

Selected with ``JQAT_JAX_LAUNCHER=callback`` (read when a plan is traced; the default,
``jax-triton``, keeps the custom calls of ``jqat.ffi.triton_call``). Each launch of a plan
becomes one ``buffer_callback`` whose Python callback maps the XLA buffers to device
pointers and calls Triton's launcher on ``ctx.stream``; the plan decides everything else
(grid, scalars, constexprs, ``num_warps``, ``num_stages``, aliases). An in-place output
(``Launch.aliases``) is an ``input_output_aliases`` entry, so the kernel sees one pointer
for both; scratch buffers are outputs of the launch that writes them, as in the
jax-triton path.

Why: jax-triton hands jaxlib PTX, and jaxlib runs ptxas on it at the first launch of each
kernel in every process (docs/BENCHMARKS.md, "Cold and warm start": 2.64 s of a 4.36 s
warm start on an H200). Here each specialization is compiled by
``triton.compile`` once per process, whose on-disk cache (``TRITON_CACHE_DIR``, the same
private directory as the jax-triton path) holds the cubin, so a warm process loads it
without ptxas. The specialization is jax-triton's (every buffer 16-byte aligned, integer
scalars typed by value and specialized only for == 1, floats FP32, the same options), so
both executors build the same PTX for a launch; Triton's bundled ptxas assembles it here,
jaxlib's there (two versions, which may contract FP32 multiply-adds differently).

What it costs:

- One Python callback per kernel launch (a plan has 1 to 6), holding the GIL: the buffers'
  pointers, a CUDA context query (``ctypes``) and Triton's launcher. Measured on an H200:
  a jitted fwd+bwd costs 0.11 ms more at (1, 1024, 8, 128) causal
  (0.278 vs 0.168 ms, about 14 us per launch), 8% more at (8, 1024, 16, 128), 2% at
  (1, 4096, 16, 128). Serialized across devices by the GIL.
- ``command_buffer_compatible=False``: XLA never records the callback into a CUDA graph.
  Recorded, the Python would run once under stream capture and its launch, with that
  run's pointers, be replayed; and its first run in a context loads the cubin, a driver
  call that stream capture does not allow. So XLA splits a command buffer around every
  launch, where jax-triton's custom call can be recorded.
- JAX's persistent compilation cache: the H200 run of ``benchmarks/compile_time.py --launcher
  callback`` counted 5 hits and no miss in the warm process, so the programs were read back;
  the warm start without that cache (kernel caches only) was 2.74 s against 2.57 s (docs/BENCHMARKS.md).
- No partitioning rule: ``custom_partitioning`` lowers the per-shard function into a module
  of its own and drops its host callbacks, so ``jqat.ffi.jax_launch`` leaves this launcher's
  ops unwrapped and XLA gathers sharded operands onto every device (correct, replicated work).
  Fully manual ``jax.shard_map`` is unaffected: there the per-shard function is lowered in place.
- A kernel with global scratch (the forward, whose TMA tensor descriptors live there: 256
  bytes per program) takes it per launch from CUDA's stream-ordered allocator on XLA's
  stream (``cuMemAllocAsync``, freed behind the launch), as jaxlib does on the other path;
  that memory is outside XLA's preallocated pool, and stays mapped between launches
  (``jqat.ffi.scratch_pool``).
- Triton's launcher is host code: a small C module per kernel signature that Triton
  compiles once (a C compiler is needed on a cold cache) and keeps in its cache directory;
  loading it from there is why that directory must be private (``jqat.ffi.triton_call``).

The CUDA side runs without torch: Triton's own runtime (``triton.runtime.driver``) imports
torch to ask for the current device and stream, which would add an import of torch (1.6 s
on a CPU test machine) to the warm start this executor is for. So each cubin is loaded with
``triton.backends.nvidia.driver``'s ``CudaUtils`` into the CUDA context current on the
callback's thread (XLA's, for the device being run), once per kernel and context, and
launched with that module's ``CudaLauncher``.

On the CPU under ``TRITON_INTERPRET=1`` the callback gets host buffers and runs the
kernels in Triton's interpreter on torch views of them (DLPack, no copy), so this
executor is testable without a GPU.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import os
import threading

import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from jqat.ffi import interpreter, scratch_pool
from jqat.ffi import plan as plans
from jqat.ffi.triton_call import build, specialization  # noqa: F401  (callers name them here too)

# Triton's interpreter patches triton.language while it runs a kernel: the callbacks of several CPU devices,
# which XLA runs on threads of their own, take turns.
_INTERPRETER_LOCK = threading.Lock()

ENV = "JQAT_JAX_LAUNCHER"
LAUNCHERS = ("jax-triton", "callback")

# Triton's pointer element types of the plan's dtype names (jax-triton's map).
_POINTER_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
                  "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "int64": "i64", "int32": "i32",
                  "int16": "i16", "int8": "i8", "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8",
                  "bool": "i1"}


def launcher() -> str:
  """The JAX launcher ``JQAT_JAX_LAUNCHER`` selects: "jax-triton" (default, also when unset or empty) or "callback"."""
  name = os.environ.get(ENV) or "jax-triton"
  if name not in LAUNCHERS:
    raise ValueError(f"{ENV} must be one of {LAUNCHERS} (or unset), got {name!r}")
  return name


def interpreting() -> bool:
  """True under ``TRITON_INTERPRET=1``: the kernels run in Triton's interpreter on host buffers."""
  return os.environ.get("TRITON_INTERPRET", "0") == "1"


def launch(launch: plans.Launch, args: tuple, out_shape: tuple, aliases: dict, target: plans.Target) -> tuple:
  """Runs one plan launch as a ``buffer_callback``; returns its outputs (a tuple of arrays).

  args: the launch's arguments in kernel order, arrays where the plan has a :class:`~jqat.ffi.plan.Ref`,
    else its Python scalars.
  out_shape: ``jax.ShapeDtypeStruct`` per output of the launch.
  aliases: ``{array operand index: output index}`` (operands numbered among the arrays only).
  target: the plan's target: a compute capability, or the interpreter (a CPU backend).
  """
  refs = tuple(i for i, a in enumerate(launch.args) if isinstance(a, plans.Ref))
  if target.interpret:
    if not interpreting():
      raise RuntimeError(f"{ENV}=callback on a CPU backend runs the kernels in Triton's interpreter: set "
                         "TRITON_INTERPRET=1 before triton is first imported")
    interpreter.install()
    run = functools.partial(_run_interpreted, launch, refs)
  else:
    # Compiled while tracing, as jax-triton compiles while lowering: a kernel that fails to build fails here.
    kernel = _compile(launch.kernel, _arg_types(launch, args, out_shape), _ones(launch),
                      tuple(launch.constexprs.items()), launch.num_warps, launch.num_stages, target.compute_capability,
                      launch.maxnreg)
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    constexprs = tuple(launch.constexprs[p] for p in kernel.params[len(launch.args) + len(launch.outputs):])
    run = functools.partial(_run_compiled, kernel, grid, launch.args, refs, constexprs)
  call = buffer_callback(run, tuple(out_shape), input_output_aliases=dict(aliases), command_buffer_compatible=False)
  return tuple(call(*(args[i] for i in refs)))


def _arg_types(launch: plans.Launch, args: tuple, out_shape: tuple) -> tuple[str, ...]:
  """Triton's type of each runtime argument, outputs last: ``*bf16`` for a buffer, scalars as jax-triton types them."""
  types_ = []
  for arg, value in zip(launch.args, args):
    if isinstance(arg, plans.Ref):
      types_.append(_pointer_type(value.dtype, launch))
    elif isinstance(arg, float):
      types_.append("fp32")  # kernel scalars are FP32 (jqat.ffi.triton_call passes np.float32)
    elif isinstance(arg, int) and not isinstance(arg, bool):
      types_.append("i32" if -2**31 <= arg < 2**31 else "u32" if 0 <= arg < 2**32 else
                    "i64" if -2**63 <= arg < 2**63 else "u64")
    else:
      raise TypeError(f"{launch.name}: kernel scalars must be int or float, got {type(arg).__name__} {arg!r}")
  return tuple(types_) + tuple(_pointer_type(o.dtype, launch) for o in out_shape)


def _pointer_type(dtype, launch: plans.Launch) -> str:
  name = np.dtype(dtype).name
  if name not in _POINTER_TYPES:
    raise TypeError(f"{launch.name}: no Triton pointer type for a {name} buffer; expected one of "
                    f"{sorted(_POINTER_TYPES)}")
  return "*" + _POINTER_TYPES[name]


def _ones(launch: plans.Launch) -> tuple[int, ...]:
  """Positions of the scalar arguments equal to 1: jax-triton compiles them in as constexprs."""
  return tuple(i for i, a in enumerate(launch.args) if not isinstance(a, plans.Ref) and a == 1)


class _Kernel:
  """A compiled specialization: its kernel parameters, Triton's launcher (host code) and, per CUDA context, the
  loaded function."""

  def __init__(self, compiled, params: tuple[str, ...]):
    from triton.backends.nvidia.driver import CudaLauncher  # noqa: PLC0415  (GPU only)

    self.compiled = compiled
    self.params = params
    self.run = CudaLauncher(compiled.src, compiled.metadata)
    self.functions = {}  # CUcontext -> CUfunction
    self.lock = threading.Lock()

  def function(self) -> int:
    """The kernel's CUfunction in the current CUDA context (loaded from the cubin on first use there)."""
    context, device = _current_context()
    fn = self.functions.get(context)
    if fn is None:
      with self.lock:
        fn = self.functions.get(context)
        if fn is None:
          k = self.compiled
          fn = _cuda_utils().load_binary(k.name, k.kernel, k.metadata.shared, device)[1]
          self.functions[context] = fn
    return fn


@functools.cache
def _compile(fn, arg_types: tuple[str, ...], ones: tuple[int, ...], constexprs: tuple, num_warps: int,
             num_stages: int, compute_capability: tuple[int, int], maxnreg: int = 0) -> _Kernel:
  """:func:`build` once per process and key, with Triton's launcher.

  The key is jax-triton's: kernel, argument types (outputs last), the scalars equal to 1, constexprs
  (``(name, value)`` pairs), ``num_warps``, ``num_stages`` and the compute capability; and the register cap.
  Triton's disk cache serves the cubin across processes.
  """
  compiled = build(fn, arg_types, ones, constexprs, num_warps, num_stages, compute_capability, maxnreg)
  return _Kernel(compiled, tuple(fn.arg_names))


def _run_compiled(kernel: _Kernel, grid: tuple[int, int, int], template: tuple, refs: tuple[int, ...],
                  constexprs: tuple, ctx, outs, *ins):
  """The callback: the launch's arguments with XLA's device pointers in place of its buffers, on XLA's stream."""
  args = list(template)
  for i, buf in zip(refs, ins):
    args[i] = buf.__cuda_array_interface__["data"][0]
  args += [buf.__cuda_array_interface__["data"][0] for buf in outs]
  k = kernel.compiled
  # Triton's launcher as CompiledKernel's runner calls it, every parameter in order (constexprs are skipped
  # by the launcher); no launch hooks, which need Triton's torch-based driver.
  launch = functools.partial(kernel.run, *grid, ctx.stream, kernel.function(), k.packed_metadata, None, None, None,
                             *args, *constexprs)
  if not k.metadata.global_scratch_size:
    launch()
    return
  # A kernel that makes tensor descriptors (the forward) needs global scratch, which Triton's launcher takes from
  # the allocator set in the current context: stream-ordered memory on XLA's stream, freed there after the launch.
  scratch = _StreamScratch()
  try:
    contextvars.copy_context().run(_with_allocator, scratch, launch)
  finally:
    scratch.free()


def _with_allocator(allocator, launch) -> None:
  import triton  # noqa: PLC0415

  triton.set_allocator(allocator)
  launch()


class _DevicePointer:
  def __init__(self, ptr: int):
    self.ptr = ptr

  def data_ptr(self) -> int:
    return self.ptr


class _StreamScratch:
  """Triton's allocator for one launch: ``cuMemAllocAsync`` on the launch's stream (what jaxlib does for the
  jax-triton path's scratch); :meth:`free` queues ``cuMemFreeAsync`` behind the launch on that stream."""

  def __init__(self):
    self.taken = []

  def __call__(self, size: int, alignment: int, stream: int) -> _DevicePointer:
    if alignment > 256:  # CUDA's allocations are 256-byte aligned
      raise ValueError(f"Triton asked for scratch aligned to {alignment} bytes; CUDA's allocator gives 256")
    lib, ptr = _libcuda(), ctypes.c_uint64()
    scratch_pool.keep_mapped(lib)
    _check(lib.cuMemAllocAsync(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_void_p(stream)),
           f"cuMemAllocAsync of {size} bytes of Triton's global scratch")
    self.taken.append((ptr.value, stream))
    return _DevicePointer(ptr.value)

  def free(self) -> None:
    lib = _libcuda()
    while self.taken:
      ptr, stream = self.taken.pop()
      _check(lib.cuMemFreeAsync(ctypes.c_uint64(ptr), ctypes.c_void_p(stream)), "cuMemFreeAsync")


def _check(status: int, what: str) -> None:
  if status != 0:
    raise RuntimeError(f"jqat callback launcher: {what} failed (CUresult {status})")


def _run_interpreted(launch: plans.Launch, refs: tuple[int, ...], ctx, outs, *ins):
  """The callback on the CPU: Triton's interpreter on torch views of XLA's host buffers (outputs writeable)."""
  import torch  # noqa: PLC0415  (the interpreter works on torch tensors)

  del ctx  # no stream on the CPU
  args = list(launch.args)
  for i, buf in zip(refs, ins):
    args[i] = torch.from_dlpack(buf)
  args += [torch.from_dlpack(buf) for buf in outs]
  with _INTERPRETER_LOCK:
    launch.kernel[launch.grid](*args, **launch.constexprs, **launch.options())


@functools.cache
def _cuda_utils():
  from triton.backends.nvidia.driver import CudaUtils  # noqa: PLC0415  (no torch, unlike triton's driver)

  return CudaUtils()


@functools.cache
def _libcuda():
  return ctypes.CDLL("libcuda.so.1")


def _current_context() -> tuple[int, int]:
  """(CUcontext, device ordinal) current on this thread: XLA's for the device whose program calls back."""
  lib = _libcuda()
  context, device = ctypes.c_void_p(), ctypes.c_int()
  if lib.cuCtxGetCurrent(ctypes.byref(context)) != 0 or not context.value:
    raise RuntimeError("jqat callback launcher: no current CUDA context on XLA's callback thread")
  if lib.cuCtxGetDevice(ctypes.byref(device)) != 0:
    raise RuntimeError("jqat callback launcher: cuCtxGetDevice failed on XLA's callback thread")
  return context.value, device.value
