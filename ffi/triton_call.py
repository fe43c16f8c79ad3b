"""One wrapper around ``jax_triton.triton_call`` shared by every op.

- Works with jax-triton 0.3.1 (triton 3.6, the H200 image) and 0.4.x (triton >= 3.7):
  only keywords common to both are passed.
- jax-triton 0.3.1 sets ``TRITON_CACHE_DIR=""`` on import, which breaks Triton's
  own launcher (and its on-disk cache) in the whole process; a real directory is
  restored right after the import.
- Compiled kernels are kept on disk (``$JQAT_CACHE_DIR``, default
  ``~/.cache/jqat/kernels``): jax-triton compiles each specialization once per
  process and keeps it only in memory, so without this a new process pays the
  Triton compile of every kernel again before its first result.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import pickle
import sys

import numpy as np

_CACHE_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "jqat")


@functools.lru_cache(maxsize=None)
def jax_triton():
  """Imports jax_triton once, restoring a usable TRITON_CACHE_DIR and adding the disk cache."""
  before = os.environ.get("TRITON_CACHE_DIR")
  import jax_triton as jt  # noqa: PLC0415  (GPU-only import)

  cache = before or os.path.join(_CACHE_ROOT, "triton")
  os.makedirs(cache, exist_ok=True)
  os.environ["TRITON_CACHE_DIR"] = cache
  _install_disk_cache()
  return jt


def triton_call(*args, kernel, out_shape, grid, num_warps=4, num_stages=2, input_output_aliases=None,
                name="", **metaparams):
  """``jax_triton.triton_call`` with jqat's defaults; see its docstring for the arguments."""
  jt = jax_triton()
  # jax-triton types a Python float as fp64, which would promote the kernel's FP32
  # arithmetic; kernel scalars are FP32.
  args = tuple(np.float32(a) if isinstance(a, float) else a for a in args)
  return jt.triton_call(*args, kernel=kernel, grid=grid, num_warps=num_warps, num_stages=num_stages,
                        input_output_aliases=input_output_aliases or {}, name=name,
                        **{_out_keyword(jt.triton_call): out_shape}, **metaparams)


@functools.lru_cache(maxsize=None)
def _out_keyword(fn) -> str:
  """The output-spec keyword: ``out_shape`` up to jax-triton 0.3.x, ``out_type`` in later releases."""
  params = inspect.signature(fn).parameters
  return "out_shape" if "out_shape" in params else "out_type"


def _install_disk_cache():
  """Wraps jax-triton's kernel factory with an on-disk cache, where its internals are the known ones.

  The factory builds a ``TritonKernel`` from plain values (name, warps, CTAs,
  shared memory, PTX, TTIR, compute capability); those values and the
  specialization attributes are pickled under a key made of everything that
  decides the compiler output. Unknown internals (another jax-triton release)
  leave jax-triton as it is: correct, only slower to start.
  """
  lib = sys.modules.get("jax_triton.triton_lib")
  factory = getattr(lib, "get_or_create_triton_kernel", None)
  kernel_lib = getattr(lib, "triton_kernel_call_lib", None)
  expected = ["backend_init_func", "platform", "fn", "arg_dtypes", "scalar_args", "num_warps", "num_stages",
              "num_ctas", "compute_capability", "enable_fp_fusion", "metaparams", "dump"]
  if (factory is None or kernel_lib is None or getattr(factory, "_jqat_disk_cache", False)
      or list(inspect.signature(factory).parameters) != expected):
    return
  import triton  # noqa: PLC0415

  root = os.environ.get("JQAT_CACHE_DIR") or os.path.join(_CACHE_ROOT, "kernels")
  memo = {}

  def cached(backend_init_func, platform, fn, arg_dtypes, scalar_args, *, num_warps, num_stages, num_ctas,
             compute_capability, enable_fp_fusion, metaparams, dump):
    call = functools.partial(factory, backend_init_func, platform, fn, arg_dtypes, scalar_args,
                             num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas,
                             compute_capability=compute_capability, enable_fp_fusion=enable_fp_fusion,
                             metaparams=metaparams, dump=dump)
    if dump or not hasattr(fn, "cache_key"):
      return call()
    cc = compute_capability if compute_capability is not None else kernel_lib.get_compute_capability(0)
    # Scalars enter the compiled code only through their type and the ==1 / None specializations.
    scalars = tuple((i, t, v == 1, v is None) for i, t, v in scalar_args)
    ident = repr((fn.cache_key, fn.arg_names, platform, tuple(arg_dtypes), scalars, num_warps, num_stages,
                  num_ctas, cc, enable_fp_fusion, sorted(metaparams.items()), triton.__version__,
                  getattr(sys.modules.get("jax_triton"), "__version__", "?")))
    key = hashlib.sha256(ident.encode()).hexdigest()
    if key in memo:
      return memo[key]
    path = os.path.join(root, key[:2], key + ".pkl")
    try:
      with open(path, "rb") as f:
        ctor_args, attrs = pickle.load(f)
      memo[key] = (kernel_lib.TritonKernel(*ctor_args), attrs)
      return memo[key]
    except (OSError, EOFError, pickle.UnpicklingError, TypeError, ValueError):
      pass
    # Miss: compile through jax-triton, recording the kernel's constructor arguments.
    recorded = []
    kernel_cls = kernel_lib.TritonKernel

    def recording(*ctor_args):
      recorded.append(ctor_args)
      return kernel_cls(*ctor_args)

    kernel_lib.TritonKernel = recording
    try:
      kernel, attrs = call()
    finally:
      kernel_lib.TritonKernel = kernel_cls
    memo[key] = (kernel, attrs)
    if recorded:
      try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
          pickle.dump((recorded[-1], attrs), f)
        os.replace(tmp, path)  # atomic: concurrent processes never read a partial file
      except (OSError, pickle.PicklingError, TypeError):
        pass
    return kernel, attrs

  cached._jqat_disk_cache = True
  lib.get_or_create_triton_kernel = cached
