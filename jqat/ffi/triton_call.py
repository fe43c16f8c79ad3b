"""One wrapper around ``jax_triton.triton_call`` shared by every op, jqat's on-disk caches, and :func:`build`, the
compile of a kernel with jax-triton's specialization that the other launchers (callback, torch) use.

- Works with jax-triton 0.3.1 (triton 3.6, the H200 image) and 0.4.x (triton >= 3.7):
  only keywords common to both are passed.
- jax-triton 0.3.1 sets ``TRITON_CACHE_DIR=""`` on import, which breaks Triton's
  own launcher (and its on-disk cache) in the whole process; a real directory is
  restored right after the import.
- Compiled kernels are kept on disk (``$JQAT_CACHE_DIR/kernels``, default
  ``~/.cache/jqat/kernels``): jax-triton compiles each specialization once per
  process and keeps it only in memory, so without this a new process pays the
  Triton compile of every kernel again before its first result. An entry is plain
  JSON (no pickle, nothing from disk is ever executed on the host), checked against
  the key of the call and its content hashes before use; anything else is ignored
  and overwritten by a fresh compile.
- A kernel that makes tensor descriptors (TMA) needs Triton's global scratch, whose size
  jax-triton 0.3.1 drops: jaxlib's ``TritonKernel`` gets it from Triton's metadata here
  (jaxlib 0.11 allocates it at each launch, from the device's current memory pool,
  which ``jqat.ffi.scratch_pool`` keeps mapped).
- A register cap (a launch's ``maxnreg``), which jax-triton 0.3.1 cannot pass to Triton, rides to its kernel
  factory as a metaparameter that the factory's wrapper here takes out again: that compile's backend then parses
  its options with Triton's ``maxnreg``, its kernel is keyed with the cap (on disk and in memory) and never enters
  jax-triton's own in-memory cache, whose key has no room for it.
- Gluon kernels, which jax-triton 0.3.1's compile cannot take (it builds a Triton ``ASTSource``), are compiled by
  the wrapper of its factory with :func:`build` and become the same jaxlib ``TritonKernel`` (PTX), launched by XLA as
  any other custom call (:func:`compiles_gluon` says whether this jax-triton gets the wrapper).
- Every cache directory is created with mode 0o700 and skipped, with a warning, when
  another user could write to it: whoever writes a cache chooses the code this
  process runs on the GPU (or, for Triton's launcher and XLA, on the host).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import secrets
import stat
import sys
import tempfile
import threading
import types
import warnings

import numpy as np

from jqat.ffi import scratch_pool

_ENTRY_FORMAT = 2  # 2: the kernel's global scratch size and alignment
_MAX_ENTRY_BYTES = 256 << 20  # far above any kernel's PTX; a larger file is not an entry
_INT32_MAX = 2**31 - 1  # TritonKernel's integer fields are 32-bit


def cache_root() -> str:
  """The root of jqat's on-disk caches: ``$JQAT_CACHE_DIR``, default ``~/.cache/jqat``."""
  return os.environ.get("JQAT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "jqat")


def private_dir(path: str) -> str | None:
  """``path`` created (mode 0o700) if missing; None, with one warning, when it is not safe to use as a cache.

  Safe means a directory owned by this user that neither its group nor others can
  write: anyone else who can write a cache decides what this process loads from it.
  """
  try:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
  except OSError as e:
    problem = f"it cannot be created ({e})"
  else:
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is None:
      problem = "its owner cannot be checked on this system"
    elif not stat.S_ISDIR(st.st_mode):
      problem = "it is not a directory"
    elif st.st_uid != uid:
      problem = f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
      problem = f"its group or other users can write to it (mode {stat.S_IMODE(st.st_mode):o})"
    else:
      return path
  warnings.warn(f"jqat: not using the cache directory {path}: {problem}", RuntimeWarning, stacklevel=2)
  return None


@functools.cache
def jax_triton():
  """Imports jax_triton once, restoring a usable TRITON_CACHE_DIR and adding the disk cache."""
  before = os.environ.get("TRITON_CACHE_DIR")
  import jax_triton as jt  # GPU-only: imported on first use

  set_triton_cache_dir(before)
  _install_disk_cache()
  return jt


def set_triton_cache_dir(before: str | None) -> str:
  """Sets ``TRITON_CACHE_DIR`` to ``before`` (created if missing) or, when that is unset or empty, to
  ``$JQAT_CACHE_DIR/triton``; returns the directory.

  Triton's cache holds the launcher it compiles and loads as a shared library: a directory, the user's included,
  that fails :func:`private_dir`'s check (another user could write to it) is not used; a fresh private one is the
  fallback, with the warning that names the refused directory.
  """
  if before:
    cache = private_dir(before) or tempfile.mkdtemp(prefix="jqat-triton-")
  else:
    cache = private_dir(os.path.join(cache_root(), "triton")) or tempfile.mkdtemp(prefix="jqat-triton-")
  os.environ["TRITON_CACHE_DIR"] = cache
  return cache


_MAXNREG = "_jqat_maxnreg"  # the metaparameter that carries a register cap to the factory's wrapper


def triton_call(*args, kernel, out_shape, grid, num_warps=4, num_stages=2, input_output_aliases=None,
                name="", maxnreg=0, **metaparams):
  """``jax_triton.triton_call`` with jqat's defaults; see its docstring for the arguments.

  maxnreg: a cap on the kernel's registers per thread (Triton's option; 0 for none), through jqat's wrapper of
  jax-triton 0.3.1's kernel factory."""
  jt = jax_triton()
  if maxnreg:
    lib = sys.modules.get("jax_triton.triton_lib")
    if not getattr(getattr(lib, "get_or_create_triton_kernel", None), "_jqat_maxnreg", False):
      raise ValueError(f"maxnreg={maxnreg} (a launch-config field) needs jqat's wrapper of jax-triton 0.3.1's "
                       "kernel factory, which this jax-triton does not have: use maxnreg=0 or "
                       "JQAT_JAX_LAUNCHER=callback")
    metaparams[_MAXNREG] = int(maxnreg)
  # jax-triton types a Python float as fp64, which would promote the kernel's FP32
  # arithmetic; kernel scalars are FP32.
  args = tuple(np.float32(a) if isinstance(a, float) else a for a in args)
  return jt.triton_call(*args, kernel=kernel, grid=grid, num_warps=num_warps, num_stages=num_stages,
                        input_output_aliases=input_output_aliases or {}, name=name,
                        **{_out_keyword(jt.triton_call): out_shape}, **metaparams)


@functools.cache
def _out_keyword(fn) -> str:
  """The output-spec keyword: ``out_shape`` up to jax-triton 0.3.x, ``out_type`` in later releases."""
  params = inspect.signature(fn).parameters
  return "out_shape" if "out_shape" in params else "out_type"


# The TritonKernel constructor of jax-triton 0.3.1, in order, as entry fields; then the two that jaxlib's
# TritonKernel (0.11) takes after them and jax-triton 0.3.1 does not pass: the kernel's global scratch size and
# alignment (``_new_kernel``).
_KERNEL_FIELDS = (("kernel_name", str), ("num_warps", int), ("num_ctas", int), ("shared_mem_bytes", int),
                  ("ptx", str), ("ttir", str), ("compute_capability", int), ("global_scratch_size", int),
                  ("global_scratch_align", int))
_MAX_SCRATCH_ALIGN = 4096
_ENTRY_FIELDS = {"format": int, "key": str, "key_material": str, **dict(_KERNEL_FIELDS), "ptx_sha256": str,
                 "ttir_sha256": str, "attrs": list}


def _install_disk_cache():
  """Wraps jax-triton's kernel factory with the on-disk kernel cache, where its internals are the known ones.

  jax-triton 0.3.1's factory compiles a kernel and builds a ``TritonKernel`` from plain
  values (``_KERNEL_FIELDS``), reaching the class through its module global
  ``triton_kernel_call_lib``. On a miss the factory runs as a copy whose globals give
  that name a recorder private to the call: nothing shared is patched, so concurrent
  compiles in other threads can neither record each other's kernels nor leave the class
  replaced. The recorded values and the specialization attributes become the entry,
  keyed by everything that decides the compiler output. Unknown internals (another
  jax-triton release) leave jax-triton as it is: correct, only slower to start.
  """
  lib = sys.modules.get("jax_triton.triton_lib")
  factory = getattr(lib, "get_or_create_triton_kernel", None)
  kernel_lib = getattr(lib, "triton_kernel_call_lib", None)
  expected = ["backend_init_func", "platform", "fn", "arg_dtypes", "scalar_args", "num_warps", "num_stages",
              "num_ctas", "compute_capability", "enable_fp_fusion", "metaparams", "dump"]
  if (not isinstance(factory, types.FunctionType) or kernel_lib is None
      or getattr(factory, "_jqat_disk_cache", False)
      or "triton_kernel_call_lib" not in factory.__code__.co_names
      or factory.__globals__.get("triton_kernel_call_lib") is not kernel_lib
      or list(inspect.signature(factory).parameters) != expected):
    return
  import triton

  root = private_dir(os.path.join(cache_root(), "kernels"))
  memo = {}

  def cached(backend_init_func, platform, fn, arg_dtypes, scalar_args, *, num_warps, num_stages, num_ctas,
             compute_capability, enable_fp_fusion, metaparams, dump):
    metaparams = dict(metaparams)
    maxnreg = metaparams.pop(_MAXNREG, 0)
    if maxnreg:  # a backend that parses the cap into its options, compiled apart from jax-triton's cache
      backend_init_func = _with_maxnreg(backend_init_func, maxnreg)
    args = (backend_init_func, platform, fn, arg_dtypes, scalar_args)
    kwargs = {"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas,
              "compute_capability": compute_capability, "enable_fp_fusion": enable_fp_fusion,
              "metaparams": metaparams, "dump": dump}
    gluon = _is_gluon(fn)
    if gluon and platform != "cuda":
      raise ValueError(f"Gluon kernel {fn.__name__}: CUDA only, not {platform}")
    # Only CUDA's binary is text (PTX); on ROCm it is the path of a temporary file.
    if platform != "cuda" and not maxnreg:
      return factory(*args, **kwargs)
    cc = compute_capability if compute_capability is not None else kernel_lib.get_compute_capability(0)
    compile_gluon = lambda: _compile_gluon(fn, arg_dtypes, scalar_args, num_warps, num_stages, num_ctas, cc,
                                           metaparams, maxnreg)
    if dump or not hasattr(fn, "cache_key") or platform != "cuda":
      if gluon:
        values, attrs = compile_gluon()
        return _new_kernel(kernel_lib, values), attrs
      return _compile_recording(factory, kernel_lib, args, kwargs, bool(maxnreg))[0]
    # Scalars enter the compiled code only through their type and the ==1 / None specializations.
    scalars = tuple((i, t, v == 1, v is None) for i, t, v in scalar_args)
    material = repr(("jqat-kernel", _ENTRY_FORMAT, fn.cache_key, fn.arg_names, platform, tuple(arg_dtypes), scalars,
                     num_warps, num_stages, num_ctas, cc, enable_fp_fusion, sorted(metaparams.items()),
                     triton.__version__, getattr(sys.modules.get("jax_triton"), "__version__", "?"))
                    + ((("maxnreg", maxnreg),) if maxnreg else ()))
    key = _sha256(material)
    if key in memo:
      return memo[key]
    path = os.path.join(root, key + ".json") if root else None
    entry = _read_entry(path, material, key, len(arg_dtypes), cc) if path else None
    if entry is not None:
      ctor_args, attrs = entry
      memo[key] = (_new_kernel(kernel_lib, ctor_args), attrs)
      return memo[key]
    if gluon:
      values, attrs = compile_gluon()
      kernel = _new_kernel(kernel_lib, values)
      made = [(values, {}, kernel)]
    else:
      (kernel, attrs), made = _compile_recording(factory, kernel_lib, args, kwargs, bool(maxnreg))
    memo[key] = (kernel, attrs)
    # Nothing is built when jax-triton's in-memory cache already held the kernel; and
    # only values that built exactly the returned kernel may stand for it on disk.
    if path and len(made) == 1 and made[0][2] is kernel and not made[0][1]:
      text = _encode_entry(material, key, made[0][0], attrs)
      if text is not None:
        _write_atomically(path, text)
    return kernel, attrs

  cached._jqat_disk_cache = True
  # A cap needs the factory's in-memory cache reachable as its global (_compile_recording gives a capped compile
  # its own), as in jax-triton 0.3.1.
  cached._jqat_maxnreg = "_COMPILED_KERNEL_CACHE" in factory.__code__.co_names
  lib.get_or_create_triton_kernel = cached


def compiles_gluon() -> bool:
  """Whether :func:`triton_call` takes Gluon kernels: jax-triton's kernel factory is the one jqat wraps (0.3.1).
  jax-triton builds a Triton ``ASTSource``, which cannot hold a Gluon kernel; the wrapper compiles those itself."""
  jax_triton()
  lib = sys.modules.get("jax_triton.triton_lib")
  return bool(getattr(getattr(lib, "get_or_create_triton_kernel", None), "_jqat_disk_cache", False))


def _is_gluon(fn) -> bool:
  return bool(getattr(fn, "is_gluon", lambda: False)())


def _compile_gluon(fn, arg_dtypes, scalar_args, num_warps: int, num_stages: int, num_ctas: int, cc: int,
                   metaparams: dict, maxnreg: int):
  """(``_KERNEL_FIELDS`` values, specialization attributes) of a Gluon kernel, compiled with jax-triton's
  specialization (:func:`build`: the same as jax-triton gives a Triton kernel), so that jaxlib launches it
  as it launches jax-triton's kernels."""
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415

  if num_ctas != 1 or any(v is None for _, _, v in scalar_args):
    raise ValueError(f"Gluon kernel {fn.__name__}: one CTA a program and no None scalar, got num_ctas={num_ctas}")
  ones = tuple(i for i, _, v in scalar_args if v == 1)
  compiled = build(fn, tuple(arg_dtypes), ones, tuple(metaparams.items()), num_warps, num_stages, divmod(cc, 10),
                   maxnreg)
  md = compiled.metadata
  # A warp-specialized kernel runs more warps than ``num_warps`` (its worker partitions'): jaxlib launches what the
  # metadata says.
  values = (md.name, md.num_warps, num_ctas, md.shared, compiled.asm["ptx"], compiled.asm.get("ttgir", ""), cc,
            getattr(md, "global_scratch_size", 0) or 0, getattr(md, "global_scratch_align", 1) or 1)
  return values, specialization(tuple(arg_dtypes), GPUTarget("cuda", cc, 32))


def _with_maxnreg(backend_init_func, maxnreg: int):
  """``backend_init_func`` whose backend parses every compile's options with Triton's ``maxnreg`` set."""

  def init(*args, **kwargs):
    backend = backend_init_func(*args, **kwargs)
    parse_options = backend.parse_options
    backend.parse_options = lambda opts: parse_options({**opts, "maxnreg": maxnreg})
    return backend

  return init


def _new_kernel(kernel_lib, ctor_args: tuple):
  """jaxlib's ``TritonKernel`` from the ``_KERNEL_FIELDS`` values: jax-triton 0.3.1's seven, and the global scratch
  size and alignment only for a kernel that has scratch (Triton's tensor descriptors made in the kernel: jaxlib
  then allocates ``size`` bytes per program for each launch). jaxlib before 0.11 takes the seven alone."""
  *plain, size, align = ctor_args
  if not size:
    return kernel_lib.TritonKernel(*plain)
  try:
    kernel = kernel_lib.TritonKernel(*plain, size, align)
  except TypeError as e:
    raise RuntimeError(f"Triton kernel {plain[0]!r} needs {size} bytes of global scratch per program (tensor "
                       f"descriptors made in the kernel); this jaxlib's TritonKernel takes no scratch size "
                       f"(jaxlib 0.11 or later does)") from e
  scratch_pool.keep_mapped()  # jaxlib takes the scratch from the device's current pool at each launch
  return kernel


class _RecordingKernelLib:
  """jaxlib's ``gpu_triton`` as one compile sees it: its ``TritonKernel`` gets the kernel's global scratch (which
  jax-triton 0.3.1 drops) and records what it built."""

  def __init__(self, kernel_lib, scratch: dict):
    self._kernel_lib = kernel_lib
    self._scratch = scratch  # Triton's metadata of the compile: global_scratch_size / _align
    self.made = []  # (_KERNEL_FIELDS values, kwargs, kernel) per construction

  def __getattr__(self, name):
    return getattr(self._kernel_lib, name)

  def TritonKernel(self, *args, **kwargs):  # the class name jax-triton calls
    if kwargs or len(args) != len(_KERNEL_FIELDS) - 2:  # not jax-triton 0.3.1's call: passed on as it is
      kernel = self._kernel_lib.TritonKernel(*args, **kwargs)
      self.made.append((args, kwargs, kernel))
      return kernel
    values = (*args, self._scratch.get("global_scratch_size", 0), self._scratch.get("global_scratch_align", 1))
    kernel = _new_kernel(self._kernel_lib, values)
    self.made.append((values, kwargs, kernel))
    return kernel


def _scratch_recording(backend_init_func, scratch: dict):
  """``backend_init_func`` whose backend (a new one per compile) copies the global scratch figures of
  ``make_llir``'s metadata into ``scratch``."""

  def init(*args, **kwargs):
    backend = backend_init_func(*args, **kwargs)
    make_llir = backend.make_llir

    def recording_make_llir(src, metadata, *rest, **kw):
      out = make_llir(src, metadata, *rest, **kw)
      for name in ("global_scratch_size", "global_scratch_align"):
        if isinstance(metadata.get(name), int):
          scratch[name] = metadata[name]
      return out

    backend.make_llir = recording_make_llir
    return backend

  return init


def _compile_recording(factory, kernel_lib, args, kwargs, own_cache: bool = False):
  """``factory(*args, **kwargs)`` run with a private recorder as its ``triton_kernel_call_lib`` (and its backend's
  ``make_llir`` reporting the kernel's global scratch to the recorder).

  own_cache: the factory sees an empty in-memory cache of its own (``_COMPILED_KERNEL_CACHE``), so it compiles,
  and what it compiles stays out of the shared one (a kernel with a register cap, which jax-triton's key omits).
  Returns (the factory's result, the recorder's ``made`` list).
  """
  scratch = {}
  recorder = _RecordingKernelLib(kernel_lib, scratch)
  own = {"_COMPILED_KERNEL_CACHE": {}} if own_cache else {}
  run = types.FunctionType(factory.__code__, {**factory.__globals__, "triton_kernel_call_lib": recorder, **own},
                           factory.__name__, factory.__defaults__, factory.__closure__)
  run.__kwdefaults__ = factory.__kwdefaults__
  return run(_scratch_recording(args[0], scratch), *args[1:], **kwargs), recorder.made


def _sha256(text: str) -> str:
  return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _encode_entry(material: str, key: str, ctor_args: tuple, attrs: dict) -> str | None:
  """The JSON entry for one kernel; None when its values are not the plain ones an entry can hold exactly."""
  if len(ctor_args) != len(_KERNEL_FIELDS) or any(type(v) is not t for v, (_, t) in zip(ctor_args, _KERNEL_FIELDS)):
    return None
  fields = {name: v for v, (name, _) in zip(ctor_args, _KERNEL_FIELDS)}
  encoded_attrs = [[list(index), values] for index, values in attrs.items()]
  if _decode_attrs(encoded_attrs, len(attrs)) != attrs:  # e.g. tuples, which JSON would turn into lists
    return None
  return json.dumps(dict(format=_ENTRY_FORMAT, key=key, key_material=material, **fields,
                         ptx_sha256=_sha256(fields["ptx"]), ttir_sha256=_sha256(fields["ttir"]), attrs=encoded_attrs))


def _decode_attrs(value, n_args: int) -> dict | None:
  """Specialization attributes ``{(i,): [[name, int], ...]}`` for arguments 0..n_args-1, or None."""
  if type(value) is not list or len(value) != n_args:
    return None
  attrs = {}
  for item in value:
    if type(item) is not list or len(item) != 2:
      return None
    index, pairs = item
    if not (type(index) is list and len(index) == 1 and type(index[0]) is int and 0 <= index[0] < n_args):
      return None
    if type(pairs) is not list or not all(type(p) is list and len(p) == 2 and type(p[0]) is str
                                          and type(p[1]) is int for p in pairs):
      return None
    attrs[(index[0],)] = pairs
  return attrs if len(attrs) == n_args else None  # every argument once: jax-triton looks each one up


def _decode_entry(text: str, material: str, key: str, n_args: int, cc: int):
  """(TritonKernel constructor values, specialization attributes) of a valid entry for this key, else None."""
  entry = json.loads(text)
  if type(entry) is not dict or set(entry) != set(_ENTRY_FIELDS):
    return None
  if any(type(entry[name]) is not t for name, t in _ENTRY_FIELDS.items()):
    return None
  if (entry["format"] != _ENTRY_FORMAT or entry["key"] != key or entry["key_material"] != material
      or entry["compute_capability"] != cc):
    return None
  if entry["ptx_sha256"] != _sha256(entry["ptx"]) or entry["ttir_sha256"] != _sha256(entry["ttir"]):
    return None
  if not all(0 <= entry[name] <= _INT32_MAX for name in ("num_warps", "num_ctas", "shared_mem_bytes",
                                                        "global_scratch_size")):
    return None
  align = entry["global_scratch_align"]
  if not (0 < align <= _MAX_SCRATCH_ALIGN and align & (align - 1) == 0):
    return None
  attrs = _decode_attrs(entry["attrs"], n_args)
  if attrs is None:
    return None
  return tuple(entry[name] for name, _ in _KERNEL_FIELDS), attrs


def _read_entry(path: str, material: str, key: str, n_args: int, cc: int):
  """The decoded entry at ``path``, or None for a missing, unreadable, oversized or invalid one, and for anything
  that is not a regular file (a FIFO, a device, a socket, a symbolic link): those are never read. A FIFO would block
  a plain ``open``; opened non-blocking and without following links, the file is checked before the first read."""
  flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
  try:
    fd = os.open(path, flags)
  except OSError:
    return None
  try:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      return None
    with os.fdopen(fd, "rb") as f:
      fd = None  # closed by the file object
      data = f.read(_MAX_ENTRY_BYTES + 1)
  except OSError:
    return None
  finally:
    if fd is not None:
      os.close(fd)
  if len(data) > _MAX_ENTRY_BYTES:
    return None
  try:
    return _decode_entry(data.decode("utf-8"), material, key, n_args, cc)
  except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested too deep to parse
    return None


def _write_atomically(path: str, text: str):
  """Writes ``text`` to ``path`` through a temporary file unique to this process and thread, then renames it.

  Readers never see a partial entry, and concurrent writers of one key never share
  a temporary file. A failed write leaves the cache without the entry, nothing more.
  """
  tmp = f"{path}.{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(8)}.tmp"
  try:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  except OSError:
    return
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except OSError:
    with contextlib.suppress(OSError):
      os.unlink(tmp)


@functools.cache
def _triton_cache_dir() -> str:
  """Triton's cache directory, chosen as the jax-triton path chooses it (once, before the first compile)."""
  return set_triton_cache_dir(os.environ.get("TRITON_CACHE_DIR"))


def build(fn, arg_types: tuple[str, ...], ones: tuple[int, ...], constexprs: tuple, num_warps: int,
          num_stages: int, compute_capability: tuple[int, int], maxnreg: int = 0, aligned: bool = True):
  """``triton.compile`` of kernel ``fn`` with jax-triton's specialization: Triton's ``CompiledKernel``.

  arg_types: Triton types of the runtime arguments, outputs last (``"*bf16"``, ``"i32"``, ``"fp32"``).
  ones: positions of the scalar arguments equal to 1 (compiled in as constexprs, as jax-triton does).
  constexprs: ``(name, value)`` pairs of the kernel's remaining parameters.
  maxnreg: a cap on registers per thread (Triton's option), 0 for none.
  aligned: every pointer 16-byte aligned (jax-triton's specialization); False: no pointer assumed aligned (the torch
  binding's prepared ops, which take any pointer offset without compiling again).
  Needs no GPU: the cubin is built for ``compute_capability`` (or read from Triton's disk cache).
  """
  import triton  # noqa: PLC0415
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415
  from triton.compiler import ASTSource  # noqa: PLC0415

  if _is_gluon(fn):  # a Gluon kernel is compiled from its own source type
    from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # noqa: PLC0415, N814

  _triton_cache_dir()
  target = GPUTarget("cuda", 10 * compute_capability[0] + compute_capability[1], 32)
  params, given, n_args = tuple(fn.arg_names), dict(constexprs), len(arg_types)
  if len(params) < n_args or any(p not in given for p in params[n_args:]):
    raise ValueError(f"kernel {fn.__name__} takes {params}; the plan gives {n_args} arguments (outputs included) "
                     f"and the constexprs {sorted(given)}")
  attrs = specialization(arg_types, target, aligned)
  constants = {params[i]: 1 for i in ones}
  constants.update({p: given[p] for p in params[n_args:]})
  signature = dict(zip(params, arg_types))  # parameter order, the order of the launcher's arguments
  signature.update({p: "constexpr" for p in constants})
  options = dict(num_warps=num_warps, num_stages=num_stages, num_ctas=1, enable_fp_fusion=True, debug=False)
  if maxnreg:
    options["maxnreg"] = maxnreg
  return triton.compile(ASTSource(fn, signature, constexprs=constants, attrs=attrs), target=target, options=options)


def specialization(arg_types: tuple[str, ...], target, aligned: bool = True) -> dict:
  """jax-triton's specialization attributes of a kernel's arguments (Triton types ``arg_types``) on ``target`` (a
  ``GPUTarget``): every buffer 16-byte aligned ("D", what Triton's specializer says of a pointer divisible by 16;
  none with ``aligned=False``), no scalar specialized beyond == 1 (""). Written out: the specializer imports torch."""
  from triton.compiler import make_backend  # noqa: PLC0415

  backend = make_backend(target)
  return {(i,): backend.parse_attr("D" if t.startswith("*") and aligned else "") for i, t in enumerate(arg_types)}
