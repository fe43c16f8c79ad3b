"""jqat: NVFP4 quantization-aware-training (Attn-QAT) attention for JAX.

Public API:
  attention, attention_forward, attention_backward, QATConfig  - QAT attention (SPEC section 3)
  nvfp4.fake_quantize / quantize / dequantize                   - NVFP4 quantizer (SPEC section 2)
  rope_qdq                                                      - tail RoPE + microscaled QDQ (SPEC section 4)
  parallel.ulysses_attention / parallel.attention             - sequence (Ulysses), batch and head parallelism
"""

from ffi.options import DEFAULT_BLOCK_N, QATConfig
from jqat import nvfp4, parallel
from jqat._src.attention import attention, attention_backward, attention_forward
from jqat._src.compile_cache import enable_compilation_cache
from jqat._src.rope_qdq import rope_qdq

__all__ = ["DEFAULT_BLOCK_N", "QATConfig", "attention", "attention_backward", "attention_forward",
           "enable_compilation_cache", "nvfp4", "parallel", "rope_qdq"]
__version__ = "0.1.0"
