"""jqat: NVFP4 quantization-aware-training (Attn-QAT) attention for JAX.

Public API:
  attention, attention_forward, attention_backward, QATConfig  - QAT attention (SPEC section 3)
  nvfp4.fake_quantize / quantize / dequantize                   - NVFP4 quantizer (SPEC section 2)
"""

from jqat import nvfp4
from jqat._src.attention import DEFAULT_BLOCK_N, attention, attention_backward, attention_forward
from jqat._src.attention_reference import QATConfig

__all__ = ["DEFAULT_BLOCK_N", "QATConfig", "attention", "attention_backward", "attention_forward", "nvfp4"]
__version__ = "0.1.0"
