"""How fast a packed KV cache's bytes can be read, by access pattern (one GPU, torch + Triton; no arithmetic).

    python benchmarks/decode_read.py --out decode_read.json

The codes and scales of K and V, ``[B, T, K, D / 2]`` and ``[B, T, K, D / 16]`` as jqat lays them out, read once by
a Triton kernel that only XORs what it loads (so nothing is left out), two ways:

- ``per_head``: a program per (sequence, KV head, split), as a decode program of one KV head reads: D / 2 code bytes
  and D / 16 scale bytes of each key's row, at the cache's token stride;
- ``per_row``: a program per (sequence, split) reading whole token rows (every KV head's bytes of a key at once).

Same bytes either way (with ``scales=0`` the codes alone). CUDA events around the replay of a CUDA graph of 40 calls
alternating two cache copies (no call finds its cache in the L2), median of 7 replays. The decode kernel's own
copies, without its arithmetic, are ``benchmarks/decode_gluon.py --sweep``'s ``memonly`` variants.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl
from _timing import graph_replay_ms


@triton.jit
def per_head(kc, ks, vc, vs, out, T, K: tl.constexpr, TILES: tl.constexpr, SCALES: tl.constexpr,
             STAGES: tl.constexpr):
  pid = tl.program_id(0)  # b * K + head
  split = tl.program_id(1)
  rows = tl.arange(0, 64)
  words = tl.arange(0, 16)  # 64 code bytes of a key and head (D = 128)
  scale_words = tl.arange(0, 2)  # its 8 scale bytes
  acc = tl.zeros([64, 16], tl.int32)
  acc_s = tl.zeros([64, 2], tl.int32)
  for i in tl.range(0, TILES, num_stages=STAGES):
    key = (split * TILES + i) * 64 + rows
    row = ((pid // K) * T + key).to(tl.int64) * K + pid % K
    acc ^= tl.load(kc + row[:, None] * 16 + words[None, :]) ^ tl.load(vc + row[:, None] * 16 + words[None, :])
    if SCALES:
      acc_s ^= (tl.load(ks + row[:, None] * 2 + scale_words[None, :])
                ^ tl.load(vs + row[:, None] * 2 + scale_words[None, :]))
  tl.store(out + pid * tl.num_programs(1) + split, tl.sum(acc) + tl.sum(acc_s))


@triton.jit
def per_row(kc, ks, vc, vs, out, T, K: tl.constexpr, TILES: tl.constexpr, SCALES: tl.constexpr, STAGES: tl.constexpr,
            ROWS: tl.constexpr):
  b = tl.program_id(0)
  split = tl.program_id(1)
  rows = tl.arange(0, ROWS)
  words = tl.arange(0, 16 * K)
  scale_words = tl.arange(0, 2 * K)
  acc = tl.zeros([ROWS, 16 * K], tl.int32)
  acc_s = tl.zeros([ROWS, 2 * K], tl.int32)
  steps: tl.constexpr = TILES * 64 // ROWS
  for i in tl.range(0, steps, num_stages=STAGES):
    row = (b * T + (split * steps + i) * ROWS + rows).to(tl.int64)
    acc ^= (tl.load(kc + row[:, None] * (16 * K) + words[None, :])
            ^ tl.load(vc + row[:, None] * (16 * K) + words[None, :]))
    if SCALES:
      acc_s ^= (tl.load(ks + row[:, None] * (2 * K) + scale_words[None, :])
                ^ tl.load(vs + row[:, None] * (2 * K) + scale_words[None, :]))
  tl.store(out + b * tl.num_programs(1) + split, tl.sum(acc) + tl.sum(acc_s))


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="decode_read.json")
  args = ap.parse_args()
  b, t, k = 8, 32768, 8  # the (8, 32, 8, 32768, 128) decode row's cache
  draw = lambda w: torch.randint(-2**31, 2**31 - 1, (b, t, k, w), device="cuda", dtype=torch.int32)
  copies = [(draw(16), draw(2), draw(16), draw(2)) for _ in range(2)]
  out = torch.empty(1 << 16, device="cuda", dtype=torch.int32)
  rows = []
  for scales in (1, 0):
    nbytes = b * t * k * (64 + (8 if scales else 0)) * 2
    configs = [("per_head", w, 16, 0) for w in (1, 2, 4)] + [("per_row", w, 128, r) for r, w in ((16, 4), (32, 8))]
    for pattern, warps, splits, rows_per_step in configs:
      tiles = t // 64 // splits
      if pattern == "per_head":
        launch = lambda i, w=warps, s=splits, n=tiles, sc=scales: per_head[(b * k, s)](
            *copies[i % 2], out, t, k, n, sc, 3, num_warps=w)
      else:
        launch = lambda i, w=warps, s=splits, n=tiles, r=rows_per_step, sc=scales: per_row[(b, s)](
            *copies[i % 2], out, t, k, n, sc, 3, r, num_warps=w)
      ms = graph_replay_ms(launch)
      rows.append(dict(pattern=pattern, scales=bool(scales), warps=warps, splits=splits, rows=rows_per_step or 64,
                       ms=ms, tbps=nbytes / ms / 1e9, bytes=nbytes))
      print(json.dumps(rows[-1]), flush=True)
  with open(args.out, "w") as f:
    json.dump({"benchmark": "decode_read", "command": "python benchmarks/decode_read.py", "date": time.strftime(
        "%Y-%m-%d"), "device": torch.cuda.get_device_name(), "cache": [b, t, k, 128], "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
