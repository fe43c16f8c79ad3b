"""The jax-triton wrapper of ``ffi/triton_call.py`` against a stand-in jax_triton (CPU).

jax-triton only imports where jaxlib has GPU support, so these tests put small
fake modules in its place and check what jqat's layer adds: the restored
TRITON_CACHE_DIR, FP32 scalars, the output keyword of either API generation,
and the on-disk kernel cache (a second "process" loads instead of compiling).
"""

import os
import sys
import types

import numpy as np
import pytest

from ffi import triton_call as tc


class _Kernel:
  def __init__(self, *ctor_args):
    self.ctor_args = ctor_args


def _fake_jax_triton(monkeypatch, out_keyword="out_shape"):
  compiled = []
  calls = []
  kernel_lib = types.SimpleNamespace(TritonKernel=_Kernel, get_compute_capability=lambda device: 90)

  def get_or_create_triton_kernel(backend_init_func, platform, fn, arg_dtypes, scalar_args, *, num_warps,
                                  num_stages, num_ctas, compute_capability, enable_fp_fusion, metaparams, dump):
    compiled.append(fn)
    return kernel_lib.TritonKernel("k", num_warps, 1, 0, "ptx", "ttir", 90), {(0,): [["tt.divisibility", 16]]}

  lib = types.ModuleType("jax_triton.triton_lib")
  lib.get_or_create_triton_kernel = get_or_create_triton_kernel
  lib.triton_kernel_call_lib = kernel_lib
  jt = types.ModuleType("jax_triton")
  jt.__version__ = "fake"
  jt.triton_lib = lib

  def triton_call(*args, kernel, grid, name="", num_warps=None, num_stages=None, input_output_aliases=None,
                  **kwargs):
    calls.append((args, kwargs))
    return "result"

  if out_keyword == "out_type":
    def triton_call_new(*args, kernel, out_type=None, grid, name="", num_warps=None, num_stages=None,
                        input_output_aliases=None, **kwargs):
      return triton_call(*args, kernel=kernel, grid=grid, out_type=out_type, **kwargs)
    jt.triton_call = triton_call_new
  else:
    def triton_call_old(*args, kernel, out_shape, grid, name="", num_warps=None, num_stages=None,
                        input_output_aliases=None, **kwargs):
      return triton_call(*args, kernel=kernel, grid=grid, out_shape=out_shape, **kwargs)
    jt.triton_call = triton_call_old

  def importing():  # jax-triton 0.3.1 empties TRITON_CACHE_DIR on import
    os.environ["TRITON_CACHE_DIR"] = ""
    return jt

  monkeypatch.setitem(sys.modules, "jax_triton", jt)
  monkeypatch.setitem(sys.modules, "jax_triton.triton_lib", lib)
  tc.jax_triton.cache_clear()
  tc._out_keyword.cache_clear()
  return jt, lib, compiled, calls, importing


@pytest.mark.parametrize("out_keyword", ["out_shape", "out_type"])
def test_wrapper_restores_cache_dir_and_passes_fp32_scalars(monkeypatch, tmp_path, out_keyword):
  jt, _, _, calls, importing = _fake_jax_triton(monkeypatch, out_keyword)
  monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path / "kernels"))
  real_import = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__

  def fake_import(name, *a, **k):
    return importing() if name == "jax_triton" else real_import(name, *a, **k)

  monkeypatch.setattr("builtins.__import__", fake_import)
  assert tc.triton_call(1.5, 3, kernel=object(), out_shape="S", grid=(1,)) == "result"
  monkeypatch.setattr("builtins.__import__", real_import)
  assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")  # restored after the import emptied it
  args, kwargs = calls[-1]
  assert isinstance(args[0], np.float32) and args[1] == 3 and isinstance(args[1], int)
  assert kwargs[out_keyword] == "S"
  tc.jax_triton.cache_clear()


def test_disk_cache_serves_a_new_process(monkeypatch, tmp_path):
  _, lib, compiled, _, _ = _fake_jax_triton(monkeypatch)
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  fn = types.SimpleNamespace(cache_key="src-hash", arg_names=["x", "y"])
  kw = dict(num_warps=4, num_stages=2, num_ctas=1, compute_capability=None, enable_fp_fusion=True,
            metaparams={"BLOCK": 64}, dump=False)
  original = lib.get_or_create_triton_kernel
  tc._install_disk_cache()
  kernel, attrs = lib.get_or_create_triton_kernel(None, "cuda", fn, ["*bf16", "i32"], ((1, "i32", 7),), **kw)
  assert len(compiled) == 1 and kernel.ctor_args == ("k", 4, 1, 0, "ptx", "ttir", 90)
  assert len([f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".pkl")]) == 1
  # The same specialization with another scalar value: served from memory, no compile.
  lib.get_or_create_triton_kernel(None, "cuda", fn, ["*bf16", "i32"], ((1, "i32", 9),), **kw)
  assert len(compiled) == 1
  # "A new process": jax-triton's factory is fresh, the wrapper is installed again.
  lib.get_or_create_triton_kernel = original
  tc._install_disk_cache()
  kernel2, attrs2 = lib.get_or_create_triton_kernel(None, "cuda", fn, ["*bf16", "i32"], ((1, "i32", 7),), **kw)
  assert len(compiled) == 1, "the kernel was compiled again instead of read from disk"
  assert kernel2.ctor_args == kernel.ctor_args and attrs2 == attrs
  # A different specialization (a scalar equal to 1 becomes a constant) compiles.
  lib.get_or_create_triton_kernel(None, "cuda", fn, ["*bf16", "i32"], ((1, "i32", 1),), **kw)
  assert len(compiled) == 2


def test_disk_cache_leaves_unknown_internals_alone(monkeypatch):
  _, lib, _, _, _ = _fake_jax_triton(monkeypatch)
  lib.get_or_create_triton_kernel = lambda fn, compiled_kernel, args, dump=False: None  # another release's shape
  before = lib.get_or_create_triton_kernel
  tc._install_disk_cache()
  assert lib.get_or_create_triton_kernel is before
