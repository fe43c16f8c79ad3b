"""The options of QAT attention: one frozen, hashable value passed from the public API down to the plan.

Framework-free. :class:`QATConfig` holds the paper's four switches; :class:`AttentionOptions`
everything static that decides what the kernels compute. The public entry points
(``jqat.attention``, ``jqat.torch.attention``) validate user input into these
(``jqat._src.validate``); below that, nothing re-checks or re-packs them, and the
launch plan (``jqat.ffi.plan``) unpacks them into kernel constexprs in one place.
"""

from __future__ import annotations

import dataclasses

DEFAULT_BLOCK_N = 64  # KV tile of the forward; part of the function (fq(P) depends on the running max per tile)
P_SCALES = ("block", "row")
QKV_SCALES = ("block", "tensor")
# p_scale="row": probabilities in [0, 1] are multiplied by this before fq, so a row's maximum (1) maps to
# E2M1's 6 times E4M3's 448, the top of NVFP4's range (docs/NUMERICS.md). qkv_scale="tensor" maps each
# (batch, head) amax of Q, K, V to the same value.
P_ROW_RANGE = 6.0 * 448.0


@dataclasses.dataclass(frozen=True)
class QATConfig:
  """The paper's switches; all True is Attn-QAT, all False is plain BF16 flash attention."""

  quantize_qkv: bool = True  # fake-quantize Q, K, V (blocks of 16 along D)
  quantize_p: bool = True  # fake-quantize P for the forward output O
  high_precision_delta: bool = True  # delta = rowsum(O' * dO); False uses O (naive FP4 fwd + BF16 bwd)
  quantize_p_backward: bool = True  # dV = fq(P)^T dO; False uses bf16(P)


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
  """Everything static about one QAT attention call (docs/NUMERICS.md, sections 4-7).

  scale: the softmax scale (already resolved from ``None`` to ``1/sqrt(D)``).
  is_causal: causal mask, key j visible to query i iff j <= i + offset.
  block_n: KV tile of the forward, a positive multiple of 16.
  config: the paper's switches.
  local_window_size: ``(left, right)``, key j visible to query i iff
    i + offset - left <= j <= i + offset + right (``jax.nn.dot_product_attention``'s window);
    None for no window. Combines with ``is_causal`` by AND.
  causal_alignment: where the diagonal of the causal mask and the window sits when
    Tq != Tk: "top_left" (offset 0, as in JAX) or "bottom_right" (offset Tk - Tq: the
    last query sees the last key, as in chunked prefill).
  p_scale: how fq(P) is scaled (docs/NUMERICS.md, section 7.1): "block" = E4M3 scales per 16 only;
    "row" = two-level, fq(P_ROW_RANGE * exp(S - m)) with m the row max; the forward's final m is an extra
    output (``row_max``) that the backward reads. (Not in :class:`QATConfig`, whose fields are the paper's
    boolean switches.)
  qkv_scale: "block" (fq(Q), fq(K), fq(V) with E4M3 block scales only) or "tensor" (two-level: an FP32
    scale per (batch, head) above them, docs/NUMERICS.md); in the kernels "tensor" adds the launches
    of ``plan._two_level_inputs``.

  The array masks (lengths, segment ids) are operands, not options: see :data:`MASK_OPERANDS`.
  """

  scale: float
  is_causal: bool = False
  block_n: int = DEFAULT_BLOCK_N
  config: QATConfig = QATConfig()
  local_window_size: tuple[int, int] | None = None
  causal_alignment: str = "top_left"
  p_scale: str = "block"
  qkv_scale: str = "block"


# The optional mask operands, in the order every binding passes them (absent ones are left out):
# query_seq_lengths [B], key_value_seq_lengths [B], q_segment_ids [B, Tq], kv_segment_ids [B, Tk]; all int32.
# Key j is visible to query i of batch b only if i < q_len[b], j < kv_len[b] and q_seg[b, i] == kv_seg[b, j].
MASK_OPERANDS = ("q_len", "kv_len", "q_seg", "kv_seg")


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  """Everything static about one decode-attention call over a packed NVFP4 KV cache (docs/NUMERICS.md, section 10).

  scale: the softmax scale (resolved). is_causal: the Tq new tokens see each other causally (query i of a
  sequence of length L sees keys j <= L - Tq + i); else every query sees all L keys.
  block_n: the KV tile (part of the function, as in the forward). num_splits: runs of tiles walked apart and
  merged by their maxima (1: the training forward's walk). config: the paper's switches (only quantize_qkv, for
  Q, and quantize_p act: the cache is NVFP4 by construction and decode has no backward). p_scale: as in
  :class:`AttentionOptions`.
  """

  scale: float
  is_causal: bool = True
  block_n: int = DEFAULT_BLOCK_N
  num_splits: int = 1
  config: QATConfig = QATConfig()
  p_scale: str = "block"


def default_num_splits(batch: int, kv_heads: int, capacity: int, block_n: int) -> int:
  """The decode walk's splits when ``num_splits=None``: enough (batch, KV head, split) programs for a large GPU
  (about 1024, eight per SM of an H200), each run at least 8 tiles long, at most 64 runs. A function of shapes
  alone, so every implementation and device computes the same function (the runs' own maxima decide fq(P))."""
  programs = max(1, batch * kv_heads)
  tiles = -(-max(capacity, 1) // block_n)
  return int(max(1, min(-(-1024 // programs), tiles // 8, 64)))
