"""JAX's persistent compilation cache in jqat's private cache directory, for a fast warm start."""

from __future__ import annotations

import os

import jax

from jqat.ffi.triton_call import cache_root, private_dir


def enable_compilation_cache(path: str | os.PathLike | None = None) -> str | None:
  """Turns on JAX's persistent compilation cache, so a new process reads its compiled programs from disk.

  A new process still traces and lowers (where jqat's kernel cache spares the Triton
  compiles), but each XLA compile becomes a read. Every program is cached, however
  small or quick to compile: JAX's defaults skip programs compiled in under 1 s,
  which are most of what a warm start of the demo waits for.

  path: the cache directory; default ``$JQAT_CACHE_DIR/xla`` (``~/.cache/jqat/xla``),
    created with mode 0o700. JAX runs what it finds there, so a directory that
    another user can write (group/world-writable, or owned by someone else) is
    refused with a warning and the cache stays off.

  Call it before the first compilation: JAX opens its cache once per process.
  Returns the directory in use, or None when the cache stays off.
  """
  if path is not None and not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"path must be a str, an os.PathLike or None; got {type(path).__name__}")
  directory = private_dir(os.fspath(path) if path is not None else os.path.join(cache_root(), "xla"))
  if directory is None:
    return None
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size floor, and no override of it
  return directory
