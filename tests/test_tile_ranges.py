"""The tile walks of the attention kernels against a brute-force visibility map.

``kv_tile_range`` (forward, dQ: the KV tiles of one query block) and ``q_tile_range`` (dK/dV: the query
tiles of one key tile) split a walk into masked tiles, tiles every live row sees in full, and skipped
tiles. The kernels rely on each part: skipped tiles must hide every key from every live row, and a tile
walked without the elementwise mask must be fully visible. The dK/dV kernel also loads those tiles
without row masks, so their rows must all be live (below ``q_lim``). Runs under TRITON_INTERPRET=1 on CPU
(compiled on a GPU). With segment ids the walks are narrowed by ``narrow_to_segments``: sorted ids (packed
documents) skip other documents' tiles and keep the tiles inside a lone document unmasked; unsorted ids
mask every tile of the walk.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import kernel_device
from oracle import visible_oracle

from jqat.kernels_triton.attention_common import (
  _search,
  kv_tile_range,
  narrow_to_segments,
  program_tile,
  q_tile_range,
  visible,
)


@triton.jit
def _ranges_kernel(args_ptr, q_seg_ptr, kv_seg_ptr, out_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
                   KV_WALK: tl.constexpr, HAS_SEG: tl.constexpr):
  """The walk of the kernels: the mask's range, narrowed to the segments as the kernels do it."""
  start = tl.load(args_ptr)
  q_lim = tl.load(args_ptr + 1)
  kv_lim = tl.load(args_ptr + 2)
  off = tl.load(args_ptr + 3)
  tq = tl.load(args_ptr + 4)
  tk = tl.load(args_ptr + 5)
  is_sorted = tl.load(args_ptr + 6)
  if KV_WALK:
    lo, a, c, hi = kv_tile_range(start, q_lim, kv_lim, off, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
    if HAS_SEG:
      rows = start + tl.arange(0, BLOCK_M)
      seg_q = tl.load(q_seg_ptr + rows, mask=rows < tq, other=0)
      lo, a, c, hi = narrow_to_segments(lo, a, c, hi, seg_q, rows < q_lim, kv_seg_ptr, kv_lim, is_sorted, BLOCK_N)
  else:
    lo, a, c, hi = q_tile_range(start, q_lim, kv_lim, off, BLOCK_M, BLOCK_N, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
    if HAS_SEG:
      keys = start + tl.arange(0, BLOCK_N)
      seg_k = tl.load(kv_seg_ptr + keys, mask=keys < tk, other=0)
      lo, a, c, hi = narrow_to_segments(lo, a, c, hi, seg_k, keys < kv_lim, q_seg_ptr, q_lim, is_sorted, BLOCK_M)
  tl.store(out_ptr, lo)
  tl.store(out_ptr + 1, a)
  tl.store(out_ptr + 2, c)
  tl.store(out_ptr + 3, hi)


MASKS = [(False, -1, -1), (True, -1, -1), (True, 40, -1), (False, 23, 17), (False, -1, 5), (True, 0, -1)]


def _draw(rng, high):
  """Random ``(tq, tk, q_lim, kv_lim, off)``: lengths below ``high``, live prefixes, top-left or bottom-right."""
  tq, tk = (int(x) for x in rng.integers(1, high, 2))
  q_lim, kv_lim = int(rng.integers(0, tq + 1)), int(rng.integers(0, tk + 1))
  return tq, tk, q_lim, kv_lim, int(rng.choice([0, tk - tq]))


def _oracle(tq, tk, q_lim, kv_lim, off, causal, left, right, q_seg=None, kv_seg=None):
  """[Tq, Tk] visibility of one batch row (``visible_oracle``), window sides given as the kernels' (-1: none)."""
  unbounded = tq + tk  # a window side of -1 (none) reaches every key
  window = None if left < 0 and right < 0 else (unbounded if left < 0 else left, unbounded if right < 0 else right)
  return visible_oracle(1, tq, tk, is_causal=causal, q_len=[q_lim], kv_len=[kv_lim], window=window,
                        bottom_right=off != 0, q_seg=None if q_seg is None else [q_seg],
                        kv_seg=None if kv_seg is None else [kv_seg])[0]


def _segments(rng, tq, tk, sorted_ids):
  """Query and key segment ids: packed documents of random lengths (one sequence of ids, cut to Tq and Tk),
  or ids in random order."""
  if sorted_ids:
    ids = np.cumsum(rng.random(max(tq, tk)) < rng.choice([0.005, 0.02, 0.1])).astype(np.int32)
    return ids[:tq], ids[:tk]
  return rng.integers(0, 3, tq).astype(np.int32), rng.integers(0, 3, tk).astype(np.int32)


@pytest.mark.parametrize("segments", [None, "sorted", "unsorted"])
@pytest.mark.parametrize("causal,left,right", MASKS, ids=lambda v: str(v))
def test_tile_walks_match_visibility(causal, left, right, segments):
  device = kernel_device()
  bm, bn = 32, 16
  rng = np.random.default_rng(7 + left + 3 * right + causal + 1000 * [None, "sorted", "unsorted"].index(segments))
  out = torch.zeros(4, dtype=torch.int32, device=device)
  unmasked = possible = 0  # tiles walked without the elementwise mask / seen in full, over all draws
  for _ in range(20 if segments is None else 10):
    tq, tk, q_lim, kv_lim, off = _draw(rng, 200)
    rows, keys = np.arange(tq), np.arange(tk)
    q_seg = kv_seg = None
    is_sorted = 0
    if segments is not None:
      q_seg, kv_seg = _segments(rng, tq, tk, segments == "sorted")
      is_sorted = int(all((np.diff(x) >= 0).all() for x in (q_seg, kv_seg)))  # as segments_sorted_kernel
    vis = _oracle(tq, tk, q_lim, kv_lim, off, causal, left, right, q_seg, kv_seg)
    seg_args = [torch.tensor(x if x is not None else np.zeros(1, np.int32), device=device) for x in (q_seg, kv_seg)]
    for kv_walk, block, other, n_outer in ((True, bn, bm, tq), (False, bm, bn, tk)):
      for start in range(0, n_outer, other):
        args = torch.tensor([start, q_lim, kv_lim, off, tq, tk, is_sorted], dtype=torch.int32, device=device)
        _ranges_kernel[(1,)](args, *seg_args, out, BLOCK_M=bm, BLOCK_N=bn, IS_CAUSAL=causal, WINDOW_LEFT=left,
                             WINDOW_RIGHT=right, KV_WALK=kv_walk, HAS_SEG=segments is not None)
        lo, a, c, hi = (int(x) for x in out.cpu())
        case = dict(tq=tq, tk=tk, q_lim=q_lim, kv_lim=kv_lim, off=off, start=start, walk="kv" if kv_walk else "q",
                    ranges=(lo, a, c, hi), is_sorted=is_sorted)
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
        unmasked += len(range(a, c, block))
        if len(live) == other and live.all():  # (the walks mask every tile of a ragged outer block)
          possible += sum(own[:, t:t + block].all() for t in range(0, inner_lim - block + 1, block))
        if is_sorted and live.any():  # packed documents: the walk ends within the own segments' indices
          own_seg = (q_seg if kv_walk else kv_seg)[start:start + other][live]
          inner_seg = (kv_seg if kv_walk else q_seg)[:inner_lim]
          first = np.searchsorted(inner_seg, own_seg.min(), "left")
          last = np.searchsorted(inner_seg, own_seg.max(), "right")
          assert lo >= min(first // block * block, hi) and hi <= last, case
  if segments != "unsorted" and possible:
    assert unmasked > 0, possible  # the walks do use unmasked tiles (with packed documents too)


@triton.jit
def _search_kernel(seg_ptr, n, values_ptr, out_ptr, STRICT: tl.constexpr):
  i = tl.program_id(0)
  tl.store(out_ptr + i, _search(seg_ptr, n, tl.load(values_ptr + i), STRICT))


@pytest.mark.parametrize("n", [0, 1, 5, 128, 129, 1000, 16384, 20000])
def test_segment_search_matches_searchsorted(n):
  """``_search`` (the narrowing's search over sorted ids, several ids per step) against numpy's."""
  device = kernel_device()
  rng = np.random.default_rng(n)
  seg = np.sort(rng.integers(0, 40, n)).astype(np.int32)
  values = np.arange(-1, 42, dtype=np.int32)
  out = torch.zeros(len(values), dtype=torch.int32, device=device)
  for strict in (False, True):
    _search_kernel[(len(values),)](torch.tensor(seg if n else np.zeros(1, np.int32), device=device), n,
                                   torch.tensor(values, device=device), out, STRICT=strict)
    np.testing.assert_array_equal(out.cpu().numpy(), np.searchsorted(seg, values, "right" if strict else "left"))


@triton.jit
def _mask_kernel(args_ptr, out_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                 WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, TRANSPOSED: tl.constexpr):
  """One tile of the kernels' elementwise mask (``visible``), as ``[rows, keys]`` (forward, dQ) or as
  ``[keys, rows]`` (TRANSPOSED: dK/dV). out: [Tq, Tk] int32."""
  q_lim = tl.load(args_ptr)
  kv_lim = tl.load(args_ptr + 1)
  off = tl.load(args_ptr + 2)
  tq = tl.load(args_ptr + 3)
  tk = tl.load(args_ptr + 4)
  rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
  keys = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
  if TRANSPOSED:
    ok = tl.trans(visible(rows[None, :], keys[:, None], rows[None, :], keys[:, None], q_lim, kv_lim, off, IS_CAUSAL,
                          WINDOW_LEFT, WINDOW_RIGHT, False))
  else:
    ok = visible(rows[:, None], keys[None, :], rows[:, None], keys[None, :], q_lim, kv_lim, off, IS_CAUSAL,
                 WINDOW_LEFT, WINDOW_RIGHT, False)
  inside = (rows[:, None] < tq) & (keys[None, :] < tk)
  tl.store(out_ptr + rows[:, None] * tk + keys[None, :], ok.to(tl.int32), mask=inside)


WINDOWS = MASKS + [(True, 40, 3), (False, 0, 0), (False, 7, -1)]


@pytest.mark.parametrize("transposed", [False, True], ids=["rows_keys", "keys_rows"])
@pytest.mark.parametrize("causal,left,right", WINDOWS, ids=lambda v: str(v))
def test_tile_masks_match_visibility(causal, left, right, transposed):
  """The elementwise mask of the kernels' masked tiles against the brute-force visibility map."""
  device = kernel_device()
  bm, bn = 32, 16
  rng = np.random.default_rng(11 + left + 3 * right + causal)
  for _ in range(6):
    tq, tk, q_lim, kv_lim, off = _draw(rng, 120)
    vis = _oracle(tq, tk, q_lim, kv_lim, off, causal, left, right)
    out = torch.full((tq, tk), -1, dtype=torch.int32, device=device)
    args = torch.tensor([q_lim, kv_lim, off, tq, tk], dtype=torch.int32, device=device)
    _mask_kernel[(triton.cdiv(tq, bm), triton.cdiv(tk, bn))](args, out, BLOCK_M=bm, BLOCK_N=bn, IS_CAUSAL=causal,
                                                            WINDOW_LEFT=left, WINDOW_RIGHT=right,
                                                            TRANSPOSED=transposed)
    np.testing.assert_array_equal(out.cpu().numpy(), vis.astype(np.int32),
                                  err_msg=str(dict(tq=tq, tk=tk, q_lim=q_lim, kv_lim=kv_lim, off=off)))


@triton.jit
def _order_kernel(out_ptr, HEAVIEST_FIRST: tl.constexpr, DESCENDING: tl.constexpr):
  """Each program writes its (tile, batch * head) at its place in launch order (program_id(0) fastest)."""
  lin = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
  tile, bh = program_tile(HEAVIEST_FIRST, DESCENDING)
  tl.store(out_ptr + 2 * lin, tile)
  tl.store(out_ptr + 2 * lin + 1, bh)


@pytest.mark.parametrize("heaviest_first,descending", [(False, False), (True, True), (True, False)])
def test_program_order(heaviest_first, descending):
  """Every (tile, batch * head) of the grid exactly once; with HEAVIEST_FIRST tile-major in launch order, every
  batch and head of a tile together, from the last tile when DESCENDING (the kernels' causal query tiles) or the
  first (causal key tiles). The kernels compute the same tile wherever it falls in the order."""
  tiles, bh = 7, 5
  out = torch.full((tiles * bh, 2), -1, dtype=torch.int32, device=kernel_device())
  _order_kernel[(tiles, bh)](out, HEAVIEST_FIRST=heaviest_first, DESCENDING=descending)
  got = [tuple(r) for r in out.cpu().tolist()]
  if not heaviest_first:
    want = [(t, h) for h in range(bh) for t in range(tiles)]  # the grid as launched
  else:
    order = range(tiles - 1, -1, -1) if descending else range(tiles)
    want = [(t, h) for t in order for h in range(bh)]
  assert got == want
  assert sorted(got) == sorted((t, h) for t in range(tiles) for h in range(bh))
