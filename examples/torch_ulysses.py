"""Ulysses sequence parallelism around ``jqat.torch.attention`` with ``torch.distributed``.

Each rank holds a sequence shard of q, k, v (BHSD: ``[B, N, T/P, D]``). One all-to-all per
tensor turns it into a head shard with whole sequences (``[B, N/P, T, D]``), jqat attention
runs locally (it needs nothing but its local tensors), and one all-to-all turns the output
back. The backward runs the same all-to-alls on the gradients. N and K must be divisible
by the number of ranks P.

    python examples/torch_ulysses.py --out /tmp/ulysses.npz     # 2 CPU processes, gloo

The run compares every rank's output and gradients with the unsharded call on the same
inputs and saves both (``tests/test_parallel.py`` checks them).
"""

from __future__ import annotations

import argparse
import os
import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import jqat.torch


class _AllToAll(torch.autograd.Function):
  """Equal-split all-to-all over dim 0 (chunk i goes to rank i); it is its own transpose."""

  @staticmethod
  def forward(ctx, x, group):
    ctx.group = group
    x = x.contiguous()  # before empty_like, which would copy a permuted view's strides
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out

  @staticmethod
  def backward(ctx, grad):
    return _AllToAll.apply(grad, ctx.group), None


def seq_to_heads(x, group=None):
  """[B, H, T/P, D] sequence shard -> [B, H/P, T, D] head shard (chunk of heads i to rank i)."""
  p = dist.get_world_size(group)
  b, h, t, d = x.shape
  x = x.reshape(b, p, h // p, t, d).permute(1, 0, 2, 3, 4)  # [P (dest), B, H/P, T/P, D]
  x = _AllToAll.apply(x, group)  # [P (source = sequence chunk), B, H/P, T/P, D]
  return x.permute(1, 2, 0, 3, 4).reshape(b, h // p, p * t, d)


def heads_to_seq(x, group=None):
  """[B, H/P, T, D] head shard -> [B, H, T/P, D] sequence shard: the inverse of :func:`seq_to_heads`."""
  p = dist.get_world_size(group)
  b, h, t, d = x.shape
  x = x.reshape(b, h, p, t // p, d).permute(2, 0, 1, 3, 4)  # [P (dest = sequence chunk), B, H/P, T/P, D]
  x = _AllToAll.apply(x, group)  # [P (source = head chunk), B, H/P, T/P, D]
  return x.permute(1, 0, 2, 3, 4).reshape(b, p * h, t // p, d)


def ulysses_attention(q, k, v, group=None, **kwargs):
  """``jqat.torch.attention`` on sequence shards: q [B, N, T/P, D], k, v [B, K, S/P, D] -> [B, N, T/P, D].

  kwargs: those of ``jqat.torch.attention`` (``is_causal``, ``scale``, ``enable_gqa``).
  """
  p = dist.get_world_size(group)
  for name, x in (("q", q), ("k", k), ("v", v)):
    if x.shape[1] % p:
      raise ValueError(f"ulysses_attention: {name} heads ({x.shape[1]}) must be divisible by the world size {p}")
  out = jqat.torch.attention(seq_to_heads(q, group), seq_to_heads(k, group), seq_to_heads(v, group), **kwargs)
  return heads_to_seq(out, group)


SHAPE = (2, 8, 64, 32)  # B, N, T, D (query); K = N / 2 KV heads
KV_HEADS = 4


def _inputs():
  g = torch.Generator().manual_seed(0)
  b, n, t, d = SHAPE
  make = lambda h: torch.randn(b, h, t, d, generator=g).to(torch.bfloat16)
  return make(n), make(KV_HEADS), make(KV_HEADS), make(n)


def _worker(rank: int, world: int, port: int, out_path: str):
  os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
  dist.init_process_group("gloo", rank=rank, world_size=world)
  try:
    q, k, v, w = _inputs()
    shard = lambda x: x.chunk(world, dim=2)[rank].clone().requires_grad_(True)
    kw = {"is_causal": True, "enable_gqa": True}
    ql, kl, vl = shard(q), shard(k), shard(v)
    out = ulysses_attention(ql, kl, vl, **kw)
    (out.float() * w.chunk(world, dim=2)[rank].float()).sum().backward()
    # The unsharded call on the same inputs, each rank keeping its sequence shard.
    qf, kf, vf = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref = jqat.torch.attention(qf, kf, vf, **kw)
    (ref.float() * w.float()).sum().backward()
    local = lambda x: x.chunk(world, dim=2)[rank]
    got = {"out": out, "dq": ql.grad, "dk": kl.grad, "dv": vl.grad}
    want = {"out": local(ref), "dq": local(qf.grad), "dk": local(kf.grad), "dv": local(vf.grad)}
    arrays = {}
    for name, x in got.items():
      arrays[f"{name}_got"] = x.detach().float().numpy()
      arrays[f"{name}_want"] = want[name].detach().float().numpy()
      err = (x.float() - want[name].float()).abs().max().item()
      print(f"rank {rank} {name}: shape {tuple(x.shape)}, max |sharded - unsharded| {err:.3e}", flush=True)
    np.savez(f"{out_path}.rank{rank}.npz", **arrays)
    # Both ranks done before either closes its connections: a rank that tore the group down while the other was
    # still in its unsharded call made the other's gloo threads abort ("terminate called without an active
    # exception", SIGABRT; seen once in CI).
    dist.barrier()
  finally:
    dist.destroy_process_group()


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="ulysses", help="writes OUT.rank{i}.npz per rank")
  ap.add_argument("--world", type=int, default=2)
  args = ap.parse_args(argv)
  with socket.socket() as s:  # a free port for the rendezvous
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  mp.spawn(_worker, args=(args.world, port, args.out), nprocs=args.world, join=True)


if __name__ == "__main__":
  main()
