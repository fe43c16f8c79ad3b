"""One wrapper around ``jax_triton.triton_call`` shared by every op.

- Works with jax-triton 0.3.1 (triton 3.6, the H200 image) and 0.4.x (triton >= 3.7):
  only keywords common to both are passed.
- jax-triton 0.3.1 sets ``TRITON_CACHE_DIR=""`` on import, which breaks Triton's
  own launcher (and its on-disk cache) in the whole process; a real directory is
  restored right after the import.
"""

from __future__ import annotations

import functools
import os

import numpy as np

_DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "jqat", "triton")


@functools.lru_cache(maxsize=None)
def jax_triton():
  """Imports jax_triton once, restoring a usable TRITON_CACHE_DIR afterwards."""
  before = os.environ.get("TRITON_CACHE_DIR")
  import jax_triton as jt  # noqa: PLC0415  (GPU-only import)

  cache = before or _DEFAULT_CACHE
  os.makedirs(cache, exist_ok=True)
  os.environ["TRITON_CACHE_DIR"] = cache
  return jt


def triton_call(*args, kernel, out_shape, grid, num_warps=4, num_stages=2, input_output_aliases=None,
                name="", **metaparams):
  """``jax_triton.triton_call`` with jqat's defaults; see its docstring for the arguments."""
  jt = jax_triton()
  # jax-triton types a Python float as fp64, which would promote the kernel's FP32
  # arithmetic; kernel scalars are FP32.
  args = tuple(np.float32(a) if isinstance(a, float) else a for a in args)
  return jt.triton_call(*args, kernel=kernel, out_shape=out_shape, grid=grid, num_warps=num_warps,
                        num_stages=num_stages, input_output_aliases=input_output_aliases or {},
                        name=name, **metaparams)
