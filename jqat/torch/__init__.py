"""PyTorch front end of jqat: QAT attention and tail RoPE + QDQ on torch tensors (docs/API.md, section 2).

Layout is BHSD, as in ``torch.nn.functional.scaled_dot_product_attention``:
``q [B, H, Sq, D]``, ``k, v [B, Hkv, Skv, D]``, ``lse [B, H, Sq]`` fp32.

- CUDA tensors run the launch plans of ``jqat.ffi.plan`` -- the very kernels the JAX API
  runs inside XLA -- on torch's current CUDA stream (or ``current_stream``), with BHSD
  tensors passed as strided BTNH views: no host copies, no extra device copies. Outputs
  and scratch come from torch's caching allocator on the stream the work is ordered on.
- CPU tensors go through DLPack to the pure-JAX (XLA) reference of jqat and back (not
  zero-copy: XLA writes new buffers).

Entry points: :func:`attention` (differentiable, like ``F.scaled_dot_product_attention``;
the ``torch.library`` op ``torch.ops.jqat.attention_fwd`` underneath, so ``torch.compile``
does not break its graph; ``torch.ops.jqat.attention_out``, O without the backward's residuals, where
nothing differentiates), and the vendor API names of ``vendor``:
:func:`nvfp4_attention_qat_forward`, :func:`nvfp4_attention_qat_backward`,
:class:`Nvfp4AttentionQatBackward`, :func:`rope_qdq_inplace`, :class:`RopeQDQInplace`; serving over a packed NVFP4
KV cache: :func:`kv_cache_update` (in place) and :func:`decode_attention` (``jqat.torch._decode``).
"""

from jqat.torch._attention import attention
from jqat.torch._decode import decode_attention, kv_cache_update
from jqat.torch.vendor import (
    Nvfp4AttentionQatBackward,
    RopeQDQInplace,
    TupleDict,
    nvfp4_attention_qat_backward,
    nvfp4_attention_qat_forward,
    rope_qdq_inplace,
)

__all__ = [
    "Nvfp4AttentionQatBackward", "RopeQDQInplace", "TupleDict", "attention", "decode_attention", "kv_cache_update",
    "nvfp4_attention_qat_backward", "nvfp4_attention_qat_forward", "rope_qdq_inplace",
]
