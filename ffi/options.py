"""The options of QAT attention: one frozen, hashable value passed from the public API down to the plan.

Framework-free. :class:`QATConfig` holds the paper's four switches; :class:`AttentionOptions`
everything static that decides what the kernels compute. The public entry points
(``jqat.attention``, ``jqat.torch.attention``) validate user input into these
(``jqat._src.validate``); below that, nothing re-checks or re-packs them, and the
launch plan (``ffi.plan``) unpacks them into kernel constexprs in one place.
"""

from __future__ import annotations

import dataclasses

DEFAULT_BLOCK_N = 64  # KV tile of the forward; part of the function (fq(P) depends on the running max per tile)


@dataclasses.dataclass(frozen=True)
class QATConfig:
  """The paper's switches; all True is Attn-QAT, all False is plain BF16 flash attention."""

  quantize_qkv: bool = True  # fake-quantize Q, K, V (blocks of 16 along D)
  quantize_p: bool = True  # fake-quantize P for the forward output O
  high_precision_delta: bool = True  # delta = rowsum(O' * dO); False uses O (naive FP4 fwd + BF16 bwd)
  quantize_p_backward: bool = True  # dV = fq(P)^T dO; False uses bf16(P)


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
  """Everything static about one QAT attention call (SPEC section 3).

  scale: the softmax scale (already resolved from ``None`` to ``1/sqrt(D)``).
  is_causal: top-left aligned causal mask (key j visible to query i iff j <= i).
  block_n: KV tile of the forward, a positive multiple of 16.
  config: the paper's switches.
  """

  scale: float
  is_causal: bool = False
  block_n: int = DEFAULT_BLOCK_N
  config: QATConfig = QATConfig()
