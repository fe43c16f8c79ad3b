"""Every Triton kernel of jqat once, at ragged sizes, for NVIDIA compute-sanitizer (CUDA only).

  compute-sanitizer --tool memcheck  python benchmarks/sanitize.py
  compute-sanitizer --tool racecheck python benchmarks/sanitize.py
  compute-sanitizer --tool initcheck python benchmarks/sanitize.py

Runs through the torch binding (the same launch plans the JAX binding executes, without
XLA's own kernels in the report): the fake-quantize, forward, delta, dQ and dK/dV kernels
for causal and full attention with GQA and sizes that are no multiple of any tile, and the
RoPE-QDQ kernel in its three modes. Prints the kernels it launched; the sanitizer's summary
line ("ERROR SUMMARY: 0 errors") is the result.
"""

from __future__ import annotations

import torch

import jqat.torch as jt


def main():
  torch.manual_seed(0)
  dev = "cuda"
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


if __name__ == "__main__":
  main()
