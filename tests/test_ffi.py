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


_FLAG_KEYS = {"HW_E4M3", "HW_E2M1", "QK_F32", "DOT_BF16", "DOT_PREC", "SOFT_BF16", "HW"}  # device-dependent


def _launch_record(kernel, grid, kwargs):
  name = getattr(kernel, "__name__", None) or kernel.fn.__name__
  meta = {k: v for k, v in kwargs.items() if k not in _FLAG_KEYS}
  return name, tuple(int(g) for g in grid), tuple(sorted(meta.items()))


@pytest.mark.parametrize("causal", [False, True])
def test_jax_and_torch_bindings_launch_the_same_kernels(monkeypatch, causal):
  """ffi/attention.py (through jax-triton) and ffi/torch_launch.py (Triton's launcher) must launch
  the same kernels with the same grids and launch parameters; recorded here without running them."""
  import jax.numpy as jnp
  import torch

  from ffi import attention as ffi_attention
  from ffi import torch_launch

  jax_launches, torch_launches = [], []

  def fake_triton_call(*args, kernel, out_shape, grid, num_warps=4, num_stages=2, input_output_aliases=None,
                       name="", **meta):
    jax_launches.append(_launch_record(kernel, grid, dict(num_warps=num_warps, num_stages=num_stages, **meta)))
    outs = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    res = tuple(jnp.zeros(o.shape, o.dtype) for o in outs)
    return res if isinstance(out_shape, tuple) else res[0]

  monkeypatch.setattr(ffi_attention, "triton_call", fake_triton_call)
  monkeypatch.setattr(torch_launch, "_launch",
                      lambda kernel, grid, args, kwargs, warmup: torch_launches.append(_launch_record(kernel, grid,
                                                                                                     kwargs)))
  b, tq, tk, n, kh, d = 2, 100, 70, 8, 2, 128
  shapes = dict(q=(b, tq, n, d), k=(b, tk, kh, d), lse=(b, n, tq))
  jq, jk = jnp.zeros(shapes["q"], jnp.bfloat16), jnp.zeros(shapes["k"], jnp.bfloat16)
  ffi_attention._forward_impl(jq, jk, jk, scale=0.1, is_causal=causal, block_n=64, quantize_qkv=True, quantize_p=True)
  ffi_attention._backward_impl(jq, jq, jk, jk, jq, jnp.zeros(shapes["lse"], jnp.float32), scale=0.1,
                               is_causal=causal, quantize_qkv=True, quantize_p_backward=True)
  t = lambda key, dtype=torch.bfloat16: torch.zeros(shapes[key], dtype=dtype)
  torch_launch.attention_forward(t("q"), t("k"), t("k"), t("q"), t("q"), t("lse", torch.float32), t("k"), t("k"),
                                 scale=0.1, is_causal=causal, block_n=64, quantize_qkv=True, quantize_p=True)
  torch_launch.attention_backward(t("q"), t("q"), t("k"), t("k"), t("q"), t("lse", torch.float32), t("q"), t("k"),
                                  t("k"), t("lse", torch.float32), t("q"), t("k"), t("k"), scale=0.1,
                                  is_causal=causal, quantize_qkv=True, quantize_p_backward=True)
  assert [r[0] for r in jax_launches] == [
      "fake_quantize_rows_kernel", "fake_quantize_rows_kernel", "attention_fwd_kernel",
      "fake_quantize_rows_kernel", "fake_quantize_rows_kernel", "fake_quantize_rows_kernel",
      "attention_bwd_delta_kernel", "attention_bwd_dq_kernel", "attention_bwd_dkdv_kernel"]
  assert jax_launches == torch_launches
