"""jqat: NVFP4 quantization-aware-training (Attn-QAT) attention for JAX.

Public API:
  attention, attention_forward, attention_backward, QATConfig  - QAT attention (docs/NUMERICS.md, sections 4-7)
  nvfp4.fake_quantize / quantize / dequantize                   - NVFP4 quantizer (docs/NUMERICS.md, sections 2-3)
  rope_qdq                                                      - tail RoPE + microscaled QDQ (docs/NUMERICS.md, 9)
  init_kv_cache / kv_cache_update / decode_attention            - serving: packed NVFP4 KV cache (docs/NUMERICS.md, 10)
  parallel.ulysses_attention / parallel.attention             - sequence (Ulysses), batch and head parallelism
  nvfp4.qat_matmul                                              - the QAT linear layer (docs/API.md)
  enable_compilation_cache, DEFAULT_BLOCK_N                     - JAX's persistent cache; the default key tile

The names load on first use, so that ``jqat.kernels_triton`` (no JAX, no torch) and the framework-free
launch plans of ``jqat.ffi.plan`` can be imported without JAX.
"""

import importlib

_EXPORTS = {
  "DEFAULT_BLOCK_N": "jqat.ffi.options",
  "QATConfig": "jqat.ffi.options",
  "attention": "jqat._src.attention",
  "attention_backward": "jqat._src.attention",
  "attention_forward": "jqat._src.attention",
  "decode_attention": "jqat._src.decode",
  "enable_compilation_cache": "jqat._src.compile_cache",
  "init_kv_cache": "jqat._src.decode",
  "kv_cache_update": "jqat._src.decode",
  "rope_qdq": "jqat._src.rope_qdq",
}
_SUBMODULES = ("nvfp4", "parallel")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])
__version__ = "0.1.0"


def __getattr__(name):
  if name in _SUBMODULES:
    return importlib.import_module(f"jqat.{name}")
  if name not in _EXPORTS:
    raise AttributeError(f"module 'jqat' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted([*globals(), *_EXPORTS, *_SUBMODULES])
