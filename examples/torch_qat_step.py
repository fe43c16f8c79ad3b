"""A few Attn-QAT training steps of a tiny PyTorch model with ``jqat.torch.attention``.

Embedding -> one pre-norm causal self-attention block (NVFP4 QAT attention) -> MLP -> head,
trained on a toy next-token task (predict the previous token + 1). Runs on CUDA when
available (the Triton kernels, on torch's current stream), else on the CPU (the JAX reference
through DLPack).

    python examples/torch_qat_step.py [--steps 20] [--cpu]
"""

from __future__ import annotations

import argparse
import time

import torch  # noqa: E402

import jqat.torch as jt  # noqa: E402


class Block(torch.nn.Module):
  def __init__(self, dim: int, heads: int, kv_heads: int):
    super().__init__()
    self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
    self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
    self.q = torch.nn.Linear(dim, dim, bias=False)
    self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
    self.o = torch.nn.Linear(dim, dim, bias=False)
    self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

  def forward(self, x):
    b, s, _ = x.shape
    h = self.norm1(x)
    # [B, S, H, D] projections viewed as BHSD: strided views, passed to the kernels without a copy.
    q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
    k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
    a = jt.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True, enable_gqa=True)
    x = x + self.o(a.transpose(1, 2).reshape(b, s, -1).to(x.dtype))
    return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
  def __init__(self, vocab=64, dim=128, heads=4, kv_heads=2):
    super().__init__()
    self.embed = torch.nn.Embedding(vocab, dim)
    self.block = Block(dim, heads, kv_heads)
    self.head = torch.nn.Linear(dim, vocab)

  def forward(self, tokens):
    return self.head(self.block(self.embed(tokens)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
  args = parser.parse_args()
  device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
  torch.manual_seed(0)
  vocab, batch, seq = 64, 8, 64
  model = TinyLM(vocab).to(device)
  opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
  print(f"device: {device}")
  for step in range(args.steps):
    t0 = time.perf_counter()
    inputs = torch.randint(0, vocab, (batch, seq), device=device)
    targets = (inputs[:, :-1] + 1) % vocab  # position i predicts token i-1 plus one: needs attention
    logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits[:, 1:].reshape(-1, vocab), targets.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {step:3d}  loss {loss.item():.4f}  ({(time.perf_counter() - t0) * 1e3:.0f} ms)")


if __name__ == "__main__":
  main()
