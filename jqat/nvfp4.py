"""NVFP4: E2M1 values with an E4M3 scale per block of 16 (docs/NUMERICS.md, sections 2-3), and the QAT linear layer.

  fake_quantize(x, axis=-1, mask=None)   quantize and dequantize, straight-through gradient
  quantize(x, axis=-1) -> (codes, scales) the packed form (two E2M1 codes a byte, one E4M3 scale per 16)
  dequantize(codes, scales, axis=-1, dtype=jnp.bfloat16)  its inverse, in dtype
  qat_matmul(x, w)                       fq(x) @ fq(w), straight-through gradients (docs/API.md)

The quantizer lives in ``jqat._src.nvfp4``, the linear layer in ``jqat._src.qat_matmul`` (which uses the quantizer);
this module only names them.
"""

from jqat._src.nvfp4 import BLOCK, dequantize, e2m1_code, e4m3_block_scale, fake_quantize, quantize
from jqat._src.qat_matmul import qat_matmul

__all__ = ["BLOCK", "dequantize", "e2m1_code", "e4m3_block_scale", "fake_quantize", "qat_matmul", "quantize"]
