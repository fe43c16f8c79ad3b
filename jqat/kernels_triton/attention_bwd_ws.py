"""A warp-specialized NVFP4 QAT dK/dV kernel for Hopper (sm_90), in Gluon.

The function is ``attention_bwd.attention_bwd_dkdv_kernel``'s (docs/NUMERICS.md, section 5) for its simplest cases:
Q, K, V already fake-quantized, p_scale "block" or "row", fq(P) on, no masks, no segment ids, D = 64, 96 or 128, Tk
a multiple of 16 (fq(P)'s blocks along keys never mix a key past Tk with one before it). At D = 96 the tiles are of
D_PAD = 128 channels, as the Triton kernel's: the copies read channels 96-127 as zeros (a descriptor with the heads
as a dimension of their own, so the box's columns past D fall outside the tensor), and they are not stored.

Why: the Triton dK/dV kernel (64 keys x 32 query rows on one warpgroup, two programs per SM) is latency-bound: 44% of
issue slots, the tensor pipe at 34%, and the Q / dO tiles' addresses and copies take 27% of its stall samples
(docs/PERFORMANCE.md, section 4). Here, as in the warp-specialized forward (``attention_fwd_ws``):

- a producer warp (24 registers) copies each query tile's Q and dO by TMA into a ring of STAGES stages (a "ready"
  and an "empty" mbarrier per buffer), and the program's K and V tiles once;
- two consumer warpgroups, each owning 64 keys (so a program owns 128), walk the same query tiles: one Q / dO copy
  serves both, and one's softmax and fq(P) can run while the other's products occupy the tensor cores;
- inside a consumer the products are asynchronous: S^T = K Q^T and dP^T = V dO^T issued together, the exponentials
  computed while dP^T still runs, dK += dS^T Q issued before fq(P)^T is formed, dV += fq(P)^T dO after.

P is held as [keys, queries] (S^T, the Triton kernel's orientation), so dS^T and fq(P)^T are the register A operands
of the dK and dV products (their accumulator layout is the operand layout: no shared-memory round trip), and fq(P)
along keys reduces each block of 16 keys across the 8 lanes of a warp that hold them (``fq_probs_t``).

Numerics: the Triton kernel's expressions on the same FP32 values (``attention_bwd._dkdv_tile``, unmasked, block
mode), in its order: ``lse2 = lse * log2 e`` (+inf where lse is -inf), ``p = exp2((k . q) * scale log2 e - lse2)``,
``ds = p * ((v . do) - delta)``, ``dK += bf16(ds) Q``, ``dV += bf16(fq(p)) dO`` (p_scale "row":
``bf16(fq(p * rl) * inv_rl)``, with the per-row factors of ``attention_bwd_row_factors_kernel``), the query heads
of the KV head in order, their query tiles in order; at the end ``dK * scale`` and dV rounded to bf16. The dK and dV
products accumulate the same k16 steps in the same order as the Triton kernel's (query rows ascending), so the sums
agree bit for bit where the hardware's accumulation is deterministic.

Barrier protocol as in ``attention_fwd_ws`` (stage ``st`` of query tile ``t``, its n-th use ``n = t // STAGES``):
``q_ready[st]`` / ``do_ready[st]`` completed by the TMA copies, consumers wait for parity ``n & 1``;
``q_empty[st]`` / ``do_empty[st]`` (count 2) arrived at by each consumer once the products that read the buffer are
complete, the producer waits for parity ``(n & 1) ^ 1`` before its n-th fill. ``kv_ready`` (one phase) guards the
program's K and V tiles. With ROWS_IN_RING the tile's lse and delta (and row mode's factors) land in ``row_bufs`` by
the producer lanes' cp.async, each lane's ``cp.async.mbarrier.arrive`` on ``q_ready[st]`` issued before the expect,
so that the phase completes only once they have landed too.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jqat.kernels_triton.attention_common import LOG2E
from jqat.kernels_triton.attention_fwd_ws import PRODUCER_REGS, WG_ROWS, acc_layout, registers, tile_smem_layout
from jqat.kernels_triton.nvfp4 import fq_probs_t, quant_flags

CONSUMERS = gl.constexpr(2)  # consumer warpgroups, each owning WG_ROWS (64) keys
BLOCK_N = gl.constexpr(64 * CONSUMERS.value)  # keys per program
# A query tile's per-row vectors (lse, delta and, in row mode, R * l and 1 / (R * l)) as a consumer warpgroup loads
# them a tile ahead where they do not come in the ring (ROWS_IN_RING): one value a thread.
FACTORS_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))
# Their order in the ring's row_bufs (ROWS_IN_RING).
ROW_VECTORS = ("lse", "delta", "rl", "inv_rl")


@gluon.constexpr_function
def _vectors(row):
  """How many of :data:`ROW_VECTORS` a query tile has: 4 in row mode, else 2."""
  return len(ROW_VECTORS) if row else 2


HEAD_DIMS = (64, 96, 128)


# Query rows a tile in the library's launches, at D = 64 and 128: faster than 32 in both modes since lse, delta and
# row mode's factors are held a tile ahead in FACTORS_LAYOUT (docs/BENCHMARKS.md).
PLAN_BLOCK_M = 64


@gluon.constexpr_function
def _wait_asm(n, pending):
  """PTX that waits until at most ``pending`` wgmma groups are in flight and passes ``n`` values through (operands:
  n outputs, the n values, n more whose first is tested), from both arms of a branch on whether that first value is
  NaN in any lane of the warp: ptxas does not hoist the wait above the branch, and the asm's inputs place the branch
  after what computes them."""
  n, pending = int(n), int(pending)
  wait = f"wgmma.wait_group.sync.aligned {pending};"
  lines = ["{", ".reg .pred p;", f"setp.nan.f32 p, ${2 * n}, ${2 * n};", "vote.sync.any.pred p, p, 0xffffffff;",
           "@p bra.uni NAN;", wait, "bra.uni DONE;", "NAN:", wait, "DONE:"]
  lines += [f"mov.b32 ${i}, ${n + i};" for i in range(n)]
  return "\n".join(lines + ["}"])


@gluon.constexpr_function
def _wait_constraints(n):
  return ",".join(["=r"] * int(n) + ["r"] * (2 * int(n)))


@gluon.jit
def _wait_after(x, y, PENDING: gl.constexpr):
  """``x`` once at most PENDING products are in flight, the wait issued after ``y`` is computed (:func:`_wait_asm`);
  ``x``, ``y``: [64, BLOCK_M] FP32 in one accumulator layout (BLOCK_M / 2 values a thread)."""
  gl.static_assert(x.shape[1] == 64 or x.shape[1] == 32, "64 or 32 query rows a tile")
  N: gl.constexpr = x.shape[1] // 2
  return gl.inline_asm_elementwise(asm=_wait_asm(N, PENDING), constraints=_wait_constraints(N), args=[x, y],
                                   dtype=gl.float32, is_pure=False, pack=N)


@gluon.jit
def _probabilities(s, lse, qk_scale):
  """P^T of a query tile from S^T (``attention_bwd._dkdv_tile``'s expressions, unmasked)."""
  lse2 = gl.where(lse == float("-inf"), float("inf"), lse * LOG2E)  # rows without keys: P = 0
  return gl.exp2(s * qk_scale - lse2[None, :])


@gluon.jit
def _causal_mask(p, t, walk, off, key0, BLOCK_M: gl.constexpr):
  """P^T of walk tile ``t`` (keys ``key0 ..`` along its rows) with the pairs the causal mask hides (key > query row +
  off) at +0, as the Triton kernel's masked tiles have them (``attention_bwd._dkdv_tile``); a tile that hides none
  (every row at or past the consumer's last key) is returned as it is, as the Triton kernel walks it unmasked."""
  _, m0 = _tile(t, walk, BLOCK_M)
  if m0 + off < key0 + WG_ROWS - 1:
    keys = key0 + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, p.type.layout))
    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, p.type.layout))
    p = gl.where(keys[:, None] <= rows[None, :] + off, p, 0.0)
  return p


@gluon.jit
def _query_tile(t, dk, dv, p_op, k_s, v_s, q_bufs, do_bufs, row_bufs, q_ready, do_ready, q_empty, do_empty, lse, delta,
                rl_c, inv_c, s_init, qk_scale, causal, D_LAYOUT: gl.constexpr, STAGES: gl.constexpr,
                HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr, ROW: gl.constexpr, DEFER_DV: gl.constexpr,
                FIRST: gl.constexpr, IS_CAUSAL: gl.constexpr, ROWS_IN_RING: gl.constexpr):
  """Query tile ``t`` of a consumer's walk: its contribution to the consumer's dK and dV (FP32, D_LAYOUT).
  The tile's lse, delta and, ROW (p_scale "row"), R * l and 1 / (R * l), two ways:

  - ROWS_IN_RING: they come with the tile's Q in the ring (``row_bufs``, :data:`ROW_VECTORS`; rows past Tq read as 0:
    :func:`_row_copies`) and are read in S^T's column layout where they are used, each thread its own columns: no
    register holds them across a tile and no layout conversion (a warpgroup barrier each) stands before the products.
  - else ``lse``, ``delta``, ``rl_c``, ``inv_c`` (rows past Tq: -inf, 0, 1 and 0), loaded a tile ahead in
    FACTORS_LAYOUT (one register each; held a tile ahead in S^T's column layout they spilled; loaded in the tile,
    their latency stalled it), are spread to S^T's columns through shared memory: lse and delta before the products,
    the factors after dK's product is issued, when lse and delta are dead.

  IS_CAUSAL: ``causal = (walk, off, key0)`` (:func:`_causal_mask`), P^T's hidden pairs set to +0.

  DEFER_DV: the previous tile's dV product (``p_op``, its fq(P)^T as a bf16 operand) is issued here beside this
  tile's S^T and dP^T (as the forward issues P V one tile late), so it runs while this tile's exponentials are
  computed, and this tile's dV product is left to the next (or to the walk's end: the returned operand). FIRST (with
  DEFER_DV): tile 0, with no previous product. Otherwise every product is waited for within the tile (``p_op`` is
  returned unused). Returns ``(dk, dv, p_op)``."""
  COLS: gl.constexpr = gl.SliceLayout(0, s_init.type.layout)
  if not ROWS_IN_RING:
    lse = gl.convert_layout(lse, COLS)
    delta = gl.convert_layout(delta, COLS)
  st = t % STAGES
  sp = (t - 1) % STAGES
  PENDING: gl.constexpr = 1 if DEFER_DV and not FIRST else 0  # the previous dV product, issued after dP^T
  phase = (t // STAGES) & 1
  mbarrier.wait(q_ready.index(st), phase)
  s_tok = warpgroup_mma(k_s, q_bufs.index(st).permute((1, 0)), s_init, use_acc=False, is_async=True)
  mbarrier.wait(do_ready.index(st), phase)
  dp_tok = warpgroup_mma(v_s, do_bufs.index(st).permute((1, 0)), s_init, use_acc=False, is_async=True)
  if PENDING:
    dv_tok = warpgroup_mma(p_op, do_bufs.index(sp), dv, is_async=True)
  row0 = st * _vectors(ROW)  # the tile's vectors in row_bufs: ROW_VECTORS from here
  if ROWS_IN_RING:
    lse = row_bufs.index(row0).load(COLS)
  s = warpgroup_mma_wait(1 + PENDING, deps=[s_tok])  # S^T done (dP^T may still run)
  p = _probabilities(s, lse, qk_scale)
  if IS_CAUSAL:
    p = _causal_mask(p, t, causal[0], causal[1], causal[2], s_init.shape[1])
  dp = warpgroup_mma_wait(1 + PENDING, deps=[dp_tok])  # nothing new: dP^T's registers, waited for below
  dp = _wait_after(dp, p, PENDING)
  if ROWS_IN_RING:
    delta = row_bufs.index(row0 + 1).load(COLS)
  ds = p * (dp - delta[None, :])
  # S^T's accumulator layout is the register layout of the next products' A operand (16-bit, k_width 2): free.
  OPERAND: gl.constexpr = gl.DotOperandLayout(0, D_LAYOUT, 2)
  ds_op = gl.convert_layout(ds.to(gl.bfloat16), OPERAND, assert_trivial=True)
  dk_tok = warpgroup_mma(ds_op, q_bufs.index(st), dk, is_async=True)
  if ROW:  # relative to the row's maximum: p * (R * l) = R * exp(s - m) (attention_bwd._dkdv_tile)
    if ROWS_IN_RING:
      rl = row_bufs.index(row0 + 2).load(COLS)
      inv_rl = row_bufs.index(row0 + 3).load(COLS)
    else:
      rl = gl.convert_layout(rl_c, COLS)
      inv_rl = gl.convert_layout(inv_c, COLS)
    p_fq = fq_probs_t(p * rl[None, :], p.shape[0], p.shape[1], HW_E4M3, HW_E2M1)
    p_fq = gl.convert_layout(p_fq, p.type.layout, assert_trivial=True) * inv_rl[None, :]
  else:
    p_fq = fq_probs_t(p, p.shape[0], p.shape[1], HW_E4M3, HW_E2M1)  # blocks of 16 along keys; exact in bf16
  p_next = gl.convert_layout(p_fq.to(gl.bfloat16), OPERAND, assert_trivial=True)
  if DEFER_DV:
    if PENDING:
      dv, p_op = warpgroup_mma_wait(1, deps=[dv_tok, p_op])  # the previous dV product done: its dO is free
      mbarrier.arrive(do_empty.index(sp))
    dk, ds_op = warpgroup_mma_wait(0, deps=[dk_tok, ds_op])
    mbarrier.arrive(q_empty.index(st))
  else:
    dv_tok = warpgroup_mma(p_next, do_bufs.index(st), dv, is_async=True)
    dk, ds_op = warpgroup_mma_wait(1, deps=[dk_tok, ds_op])
    mbarrier.arrive(q_empty.index(st))
    dv, p_next = warpgroup_mma_wait(0, deps=[dv_tok, p_next])
    mbarrier.arrive(do_empty.index(st))
  return dk, dv, p_next


@gluon.jit
def _tile(t, walk, BLOCK_M: gl.constexpr):
  """``(g, m0)`` of walk tile ``t``: query head ``kvh * group + g``, first row ``m0``. ``walk = (first, n_w, last)``:
  each query head's tiles from tile ``first`` (0 without a causal mask), ``n_w`` of them (at least 1, for the
  division), ``last`` the walk's last tile (0 for a walk of none)."""
  first, n_w = walk[0], walk[1]
  g = t // n_w
  return g, (first + t - g * n_w) * BLOCK_M


@gluon.jit
def _rows(t, walk, b, n_heads, kvh, group, tq, cols, BLOCK_M: gl.constexpr, WIDTH: gl.constexpr = 1):
  """Offsets of walk tile ``min(t, last)``'s rows (:func:`_tile`, along ``cols``) in ``[B, N, WIDTH * Tq]`` (lse and
  delta: WIDTH 1; the row factors R * l and 1 / (R * l): 2), and which are rows (before Tq)."""
  g, m0 = _tile(gl.minimum(t, walk[2]), walk, BLOCK_M)  # m0 is added to the row's offset before the columns: fewer
  # 64-bit adds
  return (b * n_heads + kvh * group + g).to(gl.int64) * (WIDTH * tq) + m0 + cols, m0 + cols < tq


@gluon.jit
def _load(ptr, ok, other, EVEN: gl.constexpr):
  """``ptr``'s values, ``other`` where ``ok`` is false (EVEN: every one is true, no mask)."""
  if EVEN:
    return gl.load(ptr)
  else:
    return gl.load(ptr, mask=ok, other=other)


@gluon.jit
def _factors(rf_ptr, t, walk, b, n_heads, kvh, group, tq, BLOCK_M: gl.constexpr, EVEN: gl.constexpr):
  """R * l and 1 / (R * l) of walk tile ``min(t, last)``'s rows (rows past Tq: 1 and 0) in FACTORS_LAYOUT,
  so that they can be held a tile ahead (:func:`_query_tile`)."""
  cols = gl.arange(0, BLOCK_M, layout=FACTORS_LAYOUT)
  at, ok = _rows(t, walk, b, n_heads, kvh, group, tq, cols, BLOCK_M, 2)
  return _load(rf_ptr + at, ok, 1.0, EVEN), _load(rf_ptr + at + tq, ok, 0.0, EVEN)


@gluon.jit
def _lse_delta(lse_ptr, delta_ptr, t, walk, b, n_heads, kvh, group, tq, BLOCK_M: gl.constexpr, EVEN: gl.constexpr):
  """lse and delta of walk tile ``min(t, last)`` (rows past Tq: -inf and 0, so that P = 0 there, as the Triton
  kernel's masked tiles have them) in FACTORS_LAYOUT, as :func:`_factors`."""
  cols = gl.arange(0, BLOCK_M, layout=FACTORS_LAYOUT)
  at, ok = _rows(t, walk, b, n_heads, kvh, group, tq, cols, BLOCK_M)
  return _load(lse_ptr + at, ok, float("-inf"), EVEN), _load(delta_ptr + at, ok, 0.0, EVEN)


@gluon.jit
def _consumer(WG: gl.constexpr, smem, scalars, HEAD_DIM: gl.constexpr, D_PAD: gl.constexpr, BLOCK_M: gl.constexpr,
              STAGES: gl.constexpr, HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr, ROW: gl.constexpr,
              EVEN: gl.constexpr, DEFER_DV: gl.constexpr, IS_CAUSAL: gl.constexpr, ROWS_IN_RING: gl.constexpr):
  """Consumer warpgroup WG: keys ``[start_n + 64 WG, +64)`` of KV head ``kvh``, batch ``b``; walks the program's query
  tiles (``walk``, :func:`_tile`) of the KV head's ``group`` query heads and stores its dK and dV rows."""
  q_bufs, do_bufs, row_bufs, k_bufs, v_bufs, kv_ready, q_ready, do_ready, q_empty, do_empty = smem
  (lse_ptr, delta_ptr, rf_ptr, dk_ptr, dv_ptr, leak_ptr, scale, walk, off, tq, tk, tiles, b, kvh, group, n_heads,
   start_n, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh) = scalars
  causal = (walk, off, start_n + WG * WG_ROWS)
  S_LAYOUT: gl.constexpr = acc_layout(BLOCK_M)  # S^T: [64 keys, BLOCK_M query rows]
  D_LAYOUT: gl.constexpr = acc_layout(D_PAD)  # dK, dV: [64 keys, D_PAD]
  qk_scale = scale * LOG2E  # as the Triton kernel forms it: one FP32 product
  k_s = k_bufs.index(WG)
  v_s = v_bufs.index(WG)
  dk = gl.zeros([WG_ROWS, D_PAD], gl.float32, layout=D_LAYOUT)
  dv = gl.zeros([WG_ROWS, D_PAD], gl.float32, layout=D_LAYOUT)
  s_init = gl.zeros([WG_ROWS, BLOCK_M], gl.float32, layout=S_LAYOUT)  # not read: use_acc=False
  mbarrier.wait(kv_ready, 0)
  if ROWS_IN_RING:  # the tile's vectors come in the ring (read in _query_tile); these placeholders are not read
    lse = gl.zeros([BLOCK_M], gl.float32, layout=FACTORS_LAYOUT)
    delta, rl_next, inv_next = lse, lse, lse
  else:
    # lse and delta loaded one tile ahead in FACTORS_LAYOUT (plain loads, cached: each row's are read by every
    # program of its KV head), so no product waits on them.
    lse, delta = _lse_delta(lse_ptr, delta_ptr, 0, walk, b, n_heads, kvh, group, tq, BLOCK_M, EVEN)
    # Row mode's factors, a tile ahead (unused in block mode, where they are never loaded).
    if ROW:
      rl_next, inv_next = _factors(rf_ptr, 0, walk, b, n_heads, kvh, group, tq, BLOCK_M, EVEN)
    else:
      rl_next = gl.zeros([BLOCK_M], gl.float32, layout=FACTORS_LAYOUT)
      inv_next = rl_next
  OPERAND: gl.constexpr = gl.DotOperandLayout(0, D_LAYOUT, 2)
  p_op = gl.zeros([WG_ROWS, BLOCK_M], gl.bfloat16, layout=OPERAND)  # the previous tile's fq(P)^T (DEFER_DV)
  if DEFER_DV:  # tile 0 (no dV product before it), then the walk from tile 1
    rl, inv = rl_next, inv_next
    if ROWS_IN_RING:
      lse_next, delta_next = lse, delta
    else:
      lse_next, delta_next = _lse_delta(lse_ptr, delta_ptr, 1, walk, b, n_heads, kvh, group, tq, BLOCK_M, EVEN)
      if ROW:
        rl_next, inv_next = _factors(rf_ptr, 1, walk, b, n_heads, kvh, group, tq, BLOCK_M, EVEN)
    dk, dv, p_op = _query_tile(0, dk, dv, p_op, k_s, v_s, q_bufs, do_bufs, row_bufs, q_ready, do_ready, q_empty,
                               do_empty, lse, delta, rl, inv, s_init, qk_scale, causal, D_LAYOUT, STAGES, HW_E4M3,
                               HW_E2M1, ROW, True, True, IS_CAUSAL, ROWS_IN_RING)
    start = 1
  else:
    lse_next, delta_next = lse, delta
    start = 0
  for t in range(start, tiles):
    lse, delta = lse_next, delta_next
    rl, inv = rl_next, inv_next
    if not ROWS_IN_RING:
      lse_next, delta_next = _lse_delta(lse_ptr, delta_ptr, t + 1, walk, b, n_heads, kvh, group, tq, BLOCK_M,
                                        EVEN)
      if ROW:
        rl_next, inv_next = _factors(rf_ptr, t + 1, walk, b, n_heads, kvh, group, tq, BLOCK_M, EVEN)
    dk, dv, p_op = _query_tile(t, dk, dv, p_op, k_s, v_s, q_bufs, do_bufs, row_bufs, q_ready, do_ready, q_empty,
                               do_empty, lse, delta, rl, inv, s_init, qk_scale, causal, D_LAYOUT, STAGES, HW_E4M3,
                               HW_E2M1, ROW, DEFER_DV, False, IS_CAUSAL, ROWS_IN_RING)
  if DEFER_DV:  # the last tile's dV product
    sp = (tiles - 1) % STAGES
    dv_tok = warpgroup_mma(p_op, do_bufs.index(sp), dv, is_async=True)
    dv, p_op = warpgroup_mma_wait(0, deps=[dv_tok, p_op])
    mbarrier.arrive(do_empty.index(sp))

  # dK * scale and dV, rounded to bf16 (``attention_bwd.cast_out``), over fq(K) and fq(V)'s storage where the plan
  # puts them there: this program read its K and V rows before its walk.
  keys = start_n + WG * WG_ROWS + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, D_LAYOUT))
  ch = gl.arange(0, D_PAD, layout=gl.SliceLayout(0, D_LAYOUT))
  k_rows = b.to(gl.int64) * stride_kb + kvh.to(gl.int64) * stride_kh + keys.to(gl.int64) * stride_kt
  v_rows = b.to(gl.int64) * stride_vb + kvh.to(gl.int64) * stride_vh + keys.to(gl.int64) * stride_vt
  keep = keys < tk
  if IS_CAUSAL:
    # A NaN that reached these keys' dK or dV may have come through a hidden pair, as in the Triton kernel's fast walk:
    # then nothing is stored (fq(K) and fq(V) stay in place) and the flag sends the key tile to that kernel's exact
    # walk (its REDO launch, the plan's next). Every consumer writes its flag, so the flags need no zeroing.
    nan = ((dk != dk) | (dv != dv)) & keep[:, None] & (ch < HEAD_DIM)[None, :]
    leaked = gl.max(gl.max(nan.to(gl.int32), axis=1), axis=0)
    tile = start_n // WG_ROWS + WG
    n_tiles = (tk + WG_ROWS - 1) // WG_ROWS
    if tile < n_tiles:
      gl.store(leak_ptr + (b * (n_heads // group) + kvh) * n_tiles + tile, leaked)
    keep = keep & (leaked == 0)
  if EVEN and not IS_CAUSAL and D_PAD == HEAD_DIM:
    gl.store(dk_ptr + k_rows[:, None] + ch[None, :], (dk * scale).to(dk_ptr.dtype.element_ty))
    gl.store(dv_ptr + v_rows[:, None] + ch[None, :], dv.to(dv_ptr.dtype.element_ty))
  else:  # the last program's keys past Tk (zeros from the copies) are not stored, nor a causal walk's leaked tile,
    # nor the padding's channels
    store = keep[:, None] & (ch < HEAD_DIM)[None, :]
    gl.store(dk_ptr + k_rows[:, None] + ch[None, :], (dk * scale).to(dk_ptr.dtype.element_ty), mask=store)
    gl.store(dv_ptr + v_rows[:, None] + ch[None, :], dv.to(dv_ptr.dtype.element_ty), mask=store)


@gluon.constexpr_function
def _box_smem_layout(rows, cols):
  """The NVMMA layout of :func:`tile_smem_layout` ([rows, cols]) for a [rows, 1, cols] box (one head of a
  [T, heads, D] descriptor): the same bytes where they are, the unit dimension adding none."""
  tile = tile_smem_layout(rows, cols)
  return gl.NVMMASharedLayout(tile.swizzle_byte_width, tile.element_bitwidth, rank=3)


@gluon.jit
def _descriptor(base, rows, heads, stride_t, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr, D_PAD: gl.constexpr):
  """A TMA descriptor over one batch's ``[rows, heads, HEAD_DIM]`` (heads side by side) with boxes of BLOCK rows of
  one head and D_PAD channels: at D_PAD = HEAD_DIM over [rows, heads * HEAD_DIM]; below it the heads are a dimension
  of their own, so that the box's channels past HEAD_DIM fall outside the tensor and are read as zeros."""
  if D_PAD == HEAD_DIM:
    return tma.make_tensor_descriptor(base, shape=[rows, heads * HEAD_DIM], strides=[stride_t, 1],
                                      block_shape=[BLOCK, HEAD_DIM], layout=tile_smem_layout(BLOCK, HEAD_DIM))
  else:
    return tma.make_tensor_descriptor(base, shape=[rows, heads, HEAD_DIM], strides=[stride_t, HEAD_DIM, 1],
                                      block_shape=[BLOCK, 1, D_PAD], layout=_box_smem_layout(BLOCK, D_PAD))


@gluon.jit
def _copy(desc, row, head, bar, buf, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr, D_PAD: gl.constexpr):
  """The TMA copy of rows ``row ..`` of ``head`` (:func:`_descriptor`) into ``buf`` ([BLOCK, D_PAD]), completing
  on ``bar``."""
  if D_PAD == HEAD_DIM:
    tma.async_copy_global_to_shared(desc, [row, head * HEAD_DIM], bar, buf)
  else:  # the copy writes the descriptor's [BLOCK, 1, D_PAD] box; the products read the same bytes as [BLOCK, D_PAD]
    box = buf._reinterpret(gl.bfloat16, [BLOCK, 1, D_PAD], _box_smem_layout(BLOCK, D_PAD))
    tma.async_copy_global_to_shared(desc, [row, head, 0], bar, box)


@gluon.jit
def _row_copies(row_bufs, row0, lse_ptr, delta_ptr, rf_ptr, head_row, m0, tq, BLOCK_M: gl.constexpr,
                ROW: gl.constexpr, EVEN: gl.constexpr):
  """cp.async copies of one query tile's per-row vectors (:data:`ROW_VECTORS`) into ``row_bufs`` from row ``row0``:
  rows ``m0 ..`` of lse and delta (``[B, N, Tq]``) at row ``head_row`` (= b N + head) and, ROW, of the row factors
  (``[B, N, 2, Tq]``). Rows past Tq are not read and land as 0: their Q and dO rows are zeros from the TMA copies,
  so whatever P they get (1 for an lse of 0) adds exact zeros to dK and dV, where the Triton kernel's lse of -inf
  gives P = 0 (a NaN of K or V reaches the same keys' dK and dV either way, through the rows before Tq)."""
  cols = m0 + gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0]))
  ok = None if EVEN else cols < tq  # EVEN: every row is before Tq, no mask
  at = head_row.to(gl.int64) * tq + cols
  async_copy.async_copy_global_to_shared(row_bufs.index(row0 + 0), lse_ptr + at, mask=ok)
  async_copy.async_copy_global_to_shared(row_bufs.index(row0 + 1), delta_ptr + at, mask=ok)
  if ROW:
    at = head_row.to(gl.int64) * (2 * tq) + cols
    async_copy.async_copy_global_to_shared(row_bufs.index(row0 + 2), rf_ptr + at, mask=ok)
    async_copy.async_copy_global_to_shared(row_bufs.index(row0 + 3), rf_ptr + at + tq, mask=ok)


@gluon.jit
def _producer(smem, args, HEAD_DIM: gl.constexpr, D_PAD: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
              ROW: gl.constexpr, EVEN: gl.constexpr, ROWS_IN_RING: gl.constexpr):
  """The producer warp: the program's K and V tiles, then Q and dO of walk tiles ``0 .. tiles - 1`` (:func:`_tile`)
  into the ring by TMA; ROWS_IN_RING: each Q with its rows' vectors (:func:`_row_copies`, completing on the same
  ``q_ready``).
  Descriptors over each batch's rows, heads side by side (``stride_h == D``; :func:`_descriptor`); made here, by the
  warp that uses them."""
  q_bufs, do_bufs, row_bufs, k_bufs, v_bufs, kv_ready, q_ready, do_ready, q_empty, do_empty = smem
  (q_ptr, do_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr, rf_ptr, walk, tq, tk, tiles, b, kvh, group, n_heads, kv_heads,
   start_n, stride_qb, stride_qt, stride_db, stride_dt, stride_kb, stride_kt, stride_vb, stride_vt) = args
  q_desc = _descriptor(q_ptr + b.to(gl.int64) * stride_qb, tq, n_heads, stride_qt, BLOCK_M, HEAD_DIM, D_PAD)
  do_desc = _descriptor(do_ptr + b.to(gl.int64) * stride_db, tq, n_heads, stride_dt, BLOCK_M, HEAD_DIM, D_PAD)
  k_desc = _descriptor(k_ptr + b.to(gl.int64) * stride_kb, tk, kv_heads, stride_kt, WG_ROWS, HEAD_DIM, D_PAD)
  v_desc = _descriptor(v_ptr + b.to(gl.int64) * stride_vb, tk, kv_heads, stride_vt, WG_ROWS, HEAD_DIM, D_PAD)
  KV_BYTES: gl.constexpr = 2 * CONSUMERS * WG_ROWS * D_PAD * 2  # a box's bytes, the zeros past D included
  mbarrier.expect(kv_ready, KV_BYTES)
  for c in gl.static_range(CONSUMERS):
    _copy(k_desc, start_n + c * WG_ROWS, kvh, kv_ready, k_bufs.index(c), WG_ROWS, HEAD_DIM, D_PAD)
    _copy(v_desc, start_n + c * WG_ROWS, kvh, kv_ready, v_bufs.index(c), WG_ROWS, HEAD_DIM, D_PAD)
  TILE_BYTES: gl.constexpr = BLOCK_M * D_PAD * 2
  for t in range(tiles):
    st = t % STAGES
    free = ((t // STAGES) & 1) ^ 1  # the (n-1)-th release of the stage; passes at once for its first fill
    g, m0 = _tile(t, walk, BLOCK_M)
    head = kvh * group + g
    mbarrier.wait(q_empty.index(st), free)
    if ROWS_IN_RING:
      _row_copies(row_bufs, st * _vectors(ROW), lse_ptr, delta_ptr, rf_ptr, b * n_heads + head, m0, tq, BLOCK_M, ROW,
                  EVEN)
      # Each lane's arrive counts up the phase's pending arrivals now and down when its copies have landed, so the
      # phase cannot complete before them; then the expect's arrive and the TMA bytes.
      async_copy.mbarrier_arrive(q_ready.index(st))
    mbarrier.expect(q_ready.index(st), TILE_BYTES)
    _copy(q_desc, m0, head, q_ready.index(st), q_bufs.index(st), BLOCK_M, HEAD_DIM, D_PAD)
    mbarrier.wait(do_empty.index(st), free)
    mbarrier.expect(do_ready.index(st), TILE_BYTES)
    _copy(do_desc, m0, head, do_ready.index(st), do_bufs.index(st), BLOCK_M, HEAD_DIM, D_PAD)


@gluon.jit
def attention_bwd_dkdv_ws_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, rf_ptr, scale, tq, tk, n_heads, group, off,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_db, stride_dt, stride_dh, dk_ptr, dv_ptr, leak_ptr,
    HEAD_DIM: gl.constexpr, D_PAD: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr, P_ROW_RANGE: gl.constexpr = 0.0, EVEN: gl.constexpr = True,
    DEFER_DV: gl.constexpr = False, IS_CAUSAL: gl.constexpr = False, ROWS_IN_RING: gl.constexpr = False):
  """dK and dV of 128 keys of one KV head per program: grid ``(cdiv(tk, 128), B * K)``. Outputs last, as the launch
  plans order arguments.

  q, do: [B, Tq, N, D] bf16; k, v, dk, dv: [B, Tk, K, D] bf16 (dk, dv with k's and v's strides), N = K * group
  (query head h reads KV head h // group); q, k, v already fake-quantized (fq along D); lse, delta: [B, N, Tq] fp32
  (the forward's lse and ``rowsum(O' * dO)``); rf: with ``P_ROW_RANGE > 0`` (p_scale "row") the row factors
  ``[B, N, 2, Tq]`` fp32 of ``attention_bwd_row_factors_kernel``, else not read (the plan passes lse, as to the
  Triton kernel). Every last axis contiguous, heads side by side (``stride_h == D``), the other strides multiples of
  16 elements. ``tq > 0``, ``tk % 16 == 0``: the copies fill rows past Tq and keys past Tk with zeros, where P is 0
  (lse of -inf) and dK, dV are not stored; EVEN: ``tq % BLOCK_M == 0`` and ``tk % 128 == 0`` (no masks on the rows'
  loads or the stores; not with IS_CAUSAL). D_PAD: the tiles' channels, 128 at D = 96, else D. Launch with
  ``num_warps=4`` (the default partition: consumer 0) and ``maxnreg`` of ``attention_fwd_ws.registers(2)``; the
  kernel adds a 4-warp consumer partition and the producer's warp. Needs the launch's global scratch (four tensor
  descriptors a program).
  IS_CAUSAL: key j is visible to query row i only where ``j <= i + off`` (``off``: 0 top-left, ``tk - tq``
  bottom-right; read only then); a program walks the query tiles from the first that holds a row seeing its first key,
  and masks the tiles that hide a pair (:func:`_causal_mask`): the Triton kernel's fast causal walk. Where a NaN
  reaches a consumer's dK or dV (it may have come through a hidden pair, as in that walk) the consumer stores nothing
  and sets its key tile's flag in ``leak`` ([B * K, cdiv(Tk, 64)] int32, every flag written), for the Triton kernel's
  exact walk (``attention_bwd_dkdv_kernel``'s REDO launch). Without IS_CAUSAL ``leak`` is not touched.
  """
  gl.static_assert(HEAD_DIM == 64 or HEAD_DIM == 96 or HEAD_DIM == 128, "D of 64, 96 or 128")
  gl.static_assert(D_PAD == HEAD_DIM or (HEAD_DIM == 96 and D_PAD == 128), "tiles of D channels, or 128 at D = 96")
  gl.static_assert(BLOCK_M == 32 or BLOCK_M == 64, "query tiles of 32 or 64 rows")
  gl.static_assert(STAGES >= 1, "at least one stage")
  gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")
  gl.static_assert(not (IS_CAUSAL and DEFER_DV), "DEFER_DV's first tile is unconditional: not with a causal walk")
  # stride_qh and stride_dh equal HEAD_DIM: the descriptors step over heads along the columns.
  stride_qb, stride_qt = stride_qb // 16 * 16, stride_qt // 16 * 16
  stride_kb, stride_kt, stride_kh = stride_kb // 16 * 16, stride_kt // 16 * 16, stride_kh // 16 * 16
  stride_vb, stride_vt, stride_vh = stride_vb // 16 * 16, stride_vt // 16 * 16, stride_vh // 16 * 16
  stride_db, stride_dt = stride_db // 16 * 16, stride_dt // 16 * 16
  pid_n = gl.program_id(0)
  pid_bk = gl.program_id(1)
  if IS_CAUSAL:  # the longest walks first, as the Triton kernel hands them out (attention_common.program_tile): every
    # KV head's first key tile, then every head's second, ...; each program computes the same tile as in launch order
    lin = pid_bk * gl.num_programs(0) + pid_n
    pid_n = lin // gl.num_programs(1)
    pid_bk = lin % gl.num_programs(1)
  kv_heads = n_heads // group
  b = pid_bk // kv_heads
  kvh = pid_bk % kv_heads
  start_n = pid_n * BLOCK_N
  n_q = (tq + BLOCK_M - 1) // BLOCK_M
  if IS_CAUSAL:  # query tiles before the first row that sees the program's first key hold no visible pair
    first = gl.maximum(start_n - off, 0) // BLOCK_M
    tiles = gl.maximum(n_q - first, 0) * group
    walk = (first, gl.maximum(n_q - first, 1), gl.maximum(tiles - 1, 0))
  else:
    tiles = n_q * group
    walk = (0, n_q, tiles - 1)

  Q_SMEM: gl.constexpr = tile_smem_layout(BLOCK_M, D_PAD)
  KV_SMEM: gl.constexpr = tile_smem_layout(WG_ROWS, D_PAD)
  q_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, D_PAD], Q_SMEM)
  do_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, D_PAD], Q_SMEM)
  ROW: gl.constexpr = P_ROW_RANGE > 0
  if ROWS_IN_RING:
    row_bufs = gl.allocate_shared_memory(gl.float32, [STAGES * _vectors(ROW), BLOCK_M],
                                         gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
  else:
    row_bufs = q_bufs  # not read
  k_bufs = gl.allocate_shared_memory(gl.bfloat16, [CONSUMERS, WG_ROWS, D_PAD], KV_SMEM)
  v_bufs = gl.allocate_shared_memory(gl.bfloat16, [CONSUMERS, WG_ROWS, D_PAD], KV_SMEM)
  kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
  q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
  do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
  q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
  do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
  mbarrier.init(kv_ready, count=1)
  for i in gl.static_range(STAGES):
    mbarrier.init(q_ready.index(i), count=1)
    mbarrier.init(do_ready.index(i), count=1)
    mbarrier.init(q_empty.index(i), count=CONSUMERS)
    mbarrier.init(do_empty.index(i), count=CONSUMERS)

  smem = (q_bufs, do_bufs, row_bufs, k_bufs, v_bufs, kv_ready, q_ready, do_ready, q_empty, do_empty)
  scalars = (lse_ptr, delta_ptr, rf_ptr, dk_ptr, dv_ptr, leak_ptr, scale, walk, off, tq, tk, tiles, b, kvh, group,
             n_heads, start_n, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh)
  args = (q_ptr, do_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr, rf_ptr, walk, tq, tk, tiles, b, kvh, group, n_heads,
          kv_heads, start_n, stride_qb, stride_qt, stride_db, stride_dt, stride_kb, stride_kt, stride_vb, stride_vt)
  gl.warp_specialize([(_consumer, (0, smem, scalars, HEAD_DIM, D_PAD, BLOCK_M, STAGES, HW_E4M3, HW_E2M1, ROW, EVEN,
                                   DEFER_DV, IS_CAUSAL, ROWS_IN_RING)),
                      (_consumer, (1, smem, scalars, HEAD_DIM, D_PAD, BLOCK_M, STAGES, HW_E4M3, HW_E2M1, ROW, EVEN,
                                   DEFER_DV, IS_CAUSAL, ROWS_IN_RING)),
                      (_producer, (smem, args, HEAD_DIM, D_PAD, BLOCK_M, STAGES, ROW, EVEN, ROWS_IN_RING))], [4, 1],
                     [CONSUMER_REGS, PRODUCER_REGS])


def launch_params(head_dim: int, block_m: int | None = None, stages: int = 2, compute_capability=(9, 0),
                  defer_dv: bool = False, p_row_range: float = 0.0, tq: int | None = None,
                  tk: int | None = None, is_causal: bool = False) -> dict:
  """Constexprs and launch options of :func:`attention_bwd_dkdv_ws_kernel` (``block_m``: PLAN_BLOCK_M when
  None; ``p_row_range``: the plan's P_ROW_RANGE with p_scale "row", else 0; ``tq``, ``tk``: the lengths, None for
  ones that the tiles divide; ``is_causal``: the causal walk, ``IS_CAUSAL``)."""
  block_m = block_m or PLAN_BLOCK_M
  maxnreg, consumer_regs = registers(CONSUMERS)
  flags = quant_flags(compute_capability)
  return {"HEAD_DIM": head_dim, "D_PAD": 128 if head_dim == 96 else head_dim, "BLOCK_M": block_m, "STAGES": stages,
          "CONSUMER_REGS": consumer_regs,
          "HW_E4M3": flags["HW_E4M3"], "HW_E2M1": flags["HW_E2M1"], "DEFER_DV": bool(defer_dv),
          "P_ROW_RANGE": float(p_row_range),
          # A causal walk of no tile (keys no row sees) still prefetches the rows after the last: its loads are masked.
          "EVEN": (tq or 0) % block_m == 0 and (tk or 0) % BLOCK_N.value == 0 and not is_causal,
          "IS_CAUSAL": bool(is_causal), "ROWS_IN_RING": rows_in_ring(head_dim, p_row_range, is_causal),
          "num_warps": 4, "maxnreg": maxnreg}


def rows_in_ring(head_dim: int, p_row_range: float, is_causal: bool) -> bool:
  """Whether a launch takes each query tile's lse, delta (and row mode's factors) in the ring with its Q
  (``ROWS_IN_RING``) rather than loading them a tile ahead in the consumers: the faster of the two on an H100 for
  each kind of launch measured (docs/BENCHMARKS.md): in the ring with the causal walk (its loop stopped spilling),
  in row mode and at D = 64; a tile ahead without a mask in block mode at D = 128 and 96."""
  return bool(is_causal) or p_row_range > 0 or head_dim == 64
