"""Every Triton kernel of jqat once, at ragged sizes, for NVIDIA compute-sanitizer (CUDA only).

  compute-sanitizer --tool memcheck  python benchmarks/sanitize.py
  compute-sanitizer --tool racecheck python benchmarks/sanitize.py
  compute-sanitizer --tool initcheck python benchmarks/sanitize.py

Runs through the torch binding (the same launch plans the JAX binding executes, without
XLA's own kernels in the report): the fake-quantize, forward, delta, dQ and dK/dV kernels
for causal and full attention with GQA and sizes that are no multiple of any tile; the
mask variants (padding lengths, packed segment ids sorted and unsorted with the
segments-sorted kernel, sliding windows, bottom-right alignment, their combination, rows
that see no key); head dims that are no power of two (48, 80, 96, 192: padded tiles); and
the RoPE-QDQ kernel in its three modes. Prints the kernels it launched; the sanitizer's summary
line ("ERROR SUMMARY: 0 errors") is the result.
"""

from __future__ import annotations

import sys

import torch

import jqat.torch as jt


def main():
  torch.manual_seed(0)
  dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"  # "cpu": a dry run of the cases through the reference
  launched = []
  for causal in (False, True):
    for b, h, hkv, sq, skv, d in ((1, 4, 2, 67, 45, 64), (2, 2, 1, 33, 130, 128)):
      q = torch.randn(b, h, sq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
      k = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
      v = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
      out = jt.attention(q, k, v, is_causal=causal, enable_gqa=True)
      out.float().square().sum().backward()
      o, o_hp, lse = jt.nvfp4_attention_qat_forward(q.detach(), k.detach(), v.detach(), is_causal=causal)
      jt.nvfp4_attention_qat_backward(torch.randn_like(o), q.detach(), k.detach(), v.detach(), o_hp, lse,
                                      is_causal=causal)
      launched.append(f"attention fwd+bwd B{b} H{h}/{hkv} {sq}x{skv} D{d} causal={causal}")
  for name, b, h, hkv, sq, skv, d, kw in _mask_cases(dev):
    _fwd_bwd(b, h, hkv, sq, skv, d, dev, **kw)
    launched.append(f"attention fwd+bwd {name} B{b} H{h}/{hkv} {sq}x{skv} D{d}")
  p = 37
  ang = torch.rand(p, 32, device=dev) * 6.3
  cache = torch.cat([ang.cos(), ang.sin()], dim=1).float().contiguous()
  for mode, shape in ((("fp4", 32, "ue8m0"), (13, 3, 128)), (("fp8", 32, "ue8m0"), (7, 512)),
                      (("fp4", 16, "e4m3"), (5, 3, 512))):
    x = torch.randn(*shape, device=dev).to(torch.bfloat16)
    rows = shape[0] if shape[-1] == 128 else x.numel() // 512
    pos = torch.randint(0, p, (rows,), device=dev, dtype=torch.int32)
    jt.rope_qdq_inplace(x, cache, pos, quantization=mode[0], group_size=mode[1], scale_format=mode[2])
    launched.append(f"rope_qdq {mode} {shape}")
  torch.cuda.synchronize()
  print("\n".join(launched))


def _fwd_bwd(b, h, hkv, sq, skv, d, dev, **kw):
  q = torch.randn(b, h, sq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
  k = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
  v = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
  out = jt.attention(q, k, v, enable_gqa=h != hkv, **kw)
  out.float().square().sum().backward()


def _mask_cases(dev):
  """(name, B, H, Hkv, Sq, Skv, D, keywords): every mask kernel variant at ragged sizes."""
  i32 = dict(device=dev, dtype=torch.int32)
  sorted_q = torch.tensor([[0] * 30 + [1] * 40 + [2] * 19, [0] * 89], **i32)
  sorted_kv = torch.tensor([[0] * 50 + [1] * 45 + [2] * 36, [0] * 100 + [1] * 31], **i32)
  unsorted_q = torch.randint(0, 3, (2, 89), **i32)
  unsorted_kv = torch.randint(0, 3, (2, 131), **i32)
  lengths = dict(query_seq_lengths=torch.tensor([89, 0], **i32), key_value_seq_lengths=torch.tensor([77, 131], **i32))
  return (
    ("lengths (a batch row with no live query)", 2, 4, 2, 89, 131, 64, lengths),
    ("lengths, causal bottom-right", 2, 4, 2, 89, 131, 128, dict(is_causal=True, causal_alignment="bottom_right",
                                                                   **lengths)),
    ("segments sorted", 2, 2, 1, 89, 131, 64, dict(q_segment_ids=sorted_q, kv_segment_ids=sorted_kv)),
    ("segments unsorted, causal", 2, 2, 2, 89, 131, 128, dict(q_segment_ids=unsorted_q, kv_segment_ids=unsorted_kv,
                                                               is_causal=True)),
    ("window (37, 5)", 1, 4, 1, 150, 150, 64, dict(local_window_size=(37, 5))),
    ("window 70 causal, bottom-right, Sq < Skv", 1, 2, 2, 45, 150, 128,
     dict(local_window_size=70, is_causal=True, causal_alignment="bottom_right")),
    ("all masks", 2, 4, 2, 89, 131, 64, dict(is_causal=True, local_window_size=(20, 0), q_segment_ids=sorted_q,
                                             kv_segment_ids=sorted_kv, **lengths)),
    *((f"head dim {d}", 1, 2, 1, 67, 45, d, dict(is_causal=d % 96 == 0)) for d in (48, 80, 96, 192)),
    ("head dim 80 with lengths", 2, 2, 2, 67, 45, 80, dict(key_value_seq_lengths=torch.tensor([3, 45], **i32))),
  )


if __name__ == "__main__":
  main()
