"""The tile walks of the attention kernels against a brute-force visibility map.

``kv_tile_range`` (forward, dQ: the KV tiles of one query block) and ``q_tile_range`` (dK/dV: the query
tiles of one key tile) split a walk into masked tiles, tiles every live row sees in full, and skipped
tiles. The kernels rely on each part: skipped tiles must hide every key from every live row, and a tile
walked without the elementwise mask must be fully visible. The dK/dV kernel also loads those tiles
without row masks, so their rows must all be live (below ``q_lim``). Runs under TRITON_INTERPRET=1 on CPU
(compiled on a GPU), without segments (with segment ids every tile takes the elementwise mask).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import kernel_device
from oracle import visible_oracle

from jqat.kernels_triton.attention_common import kv_tile_range, q_tile_range


@triton.jit
def _ranges_kernel(args_ptr, out_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, KV_WALK: tl.constexpr):
  start = tl.load(args_ptr)
  q_lim = tl.load(args_ptr + 1)
  kv_lim = tl.load(args_ptr + 2)
  off = tl.load(args_ptr + 3)
  if KV_WALK:
    lo, a, c, hi = kv_tile_range(start, q_lim, kv_lim, off, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT,
                                 False)
  else:
    lo, a, c, hi = q_tile_range(start, q_lim, kv_lim, off, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT,
                                False)
  tl.store(out_ptr, lo)
  tl.store(out_ptr + 1, a)
  tl.store(out_ptr + 2, c)
  tl.store(out_ptr + 3, hi)


MASKS = [(False, -1, -1), (True, -1, -1), (True, 40, -1), (False, 23, 17), (False, -1, 5), (True, 0, -1)]


@pytest.mark.parametrize("causal,left,right", MASKS, ids=lambda v: str(v))
def test_tile_walks_match_visibility(causal, left, right):
  device = kernel_device()
  bm, bn = 32, 16
  rng = np.random.default_rng(7 + left + 3 * right + causal)
  out = torch.zeros(4, dtype=torch.int32, device=device)
  for _ in range(20):
    tq, tk = (int(x) for x in rng.integers(1, 200, 2))
    q_lim, kv_lim = int(rng.integers(0, tq + 1)), int(rng.integers(0, tk + 1))
    off = int(rng.choice([0, tk - tq]))  # top-left or bottom-right alignment
    rows, keys = np.arange(tq), np.arange(tk)
    unbounded = tq + tk  # a window side of -1 (none) reaches every key
    window = None if left < 0 and right < 0 else (unbounded if left < 0 else left, unbounded if right < 0 else right)
    vis = visible_oracle(1, tq, tk, is_causal=causal, q_len=[q_lim], kv_len=[kv_lim], window=window,
                         bottom_right=off != 0)[0]
    for kv_walk, block, other, n_outer in ((True, bn, bm, tq), (False, bm, bn, tk)):
      for start in range(0, n_outer, other):
        args = torch.tensor([start, q_lim, kv_lim, off], dtype=torch.int32, device=device)
        _ranges_kernel[(1,)](args, out, BLOCK_M=bm, BLOCK_N=bn, IS_CAUSAL=causal, WINDOW_LEFT=left,
                             WINDOW_RIGHT=right, KV_WALK=kv_walk)
        lo, a, c, hi = (int(x) for x in out.cpu())
        case = dict(tq=tq, tk=tk, q_lim=q_lim, kv_lim=kv_lim, off=off, start=start, walk="kv" if kv_walk else "q",
                    ranges=(lo, a, c, hi))
        assert lo <= a <= c <= hi, case
        # Each non-empty walk starts on a tile boundary (tiles sit at absolute offsets, as the reference's do).
        assert all(s % block == 0 for s, e in ((lo, a), (a, c), (c, hi)) if s < e), case
        # The outer block's live rows (kv walk) or keys (q walk) against every tile of the inner axis.
        own = vis[start:start + other] if kv_walk else vis[:, start:start + other].T
        live = (rows[start:start + other] < q_lim) if kv_walk else (keys[start:start + other] < kv_lim)
        inner_lim = kv_lim if kv_walk else q_lim
        seen = own.any(axis=0)  # inner index seen by some live outer index
        assert not seen[:lo].any() and not seen[hi:].any(), case  # skipped tiles hide everything
        for t in range(a, c, block):
          assert t + block <= inner_lim, case  # unmasked tiles hold live indices only
          assert own[live][:, t:t + block].all(), case  # and every live outer index sees all of them
