"""A warp-specialized NVFP4 QAT attention forward for Hopper (sm_90), in Gluon. The forward plans (O alone, and the
training forward's O, O' and lse) launch it by default wherever it takes the launch (``ffi.plan._ws_takes``: D = 128
or 96, no mask or the causal one, p_scale "block" or "row", any lengths) but on causal walks shorter than
``ffi.plan.WS_CAUSAL_MIN_ROWS``, where the Triton forward was the faster; ``JQAT_ATTN_FWD_KERNEL=ws`` launches it
wherever it takes the launch, ``JQAT_ATTN_FWD_KERNEL=triton`` never (docs/PERFORMANCE.md, section 3).

The function is the forward of ``attention_fwd.attention_fwd_kernel`` (docs/NUMERICS.md, sections 4.3-4.4 and 7.1)
for its simplest cases: Q, K, V already fake-quantized (the quantize pass's output, ``QUANTIZE_Q`` off), p_scale
"block" or "row", non-causal or causal (top-left; IS_CAUSAL: a NaN that reached a consumer's rows leaves them to that
kernel's REDO launch), no other masks, no segment ids, D = 128, 96 (on tiles of 128 channels) or 64, KV tiles of
BLOCK_N = 64 keys, any sequence lengths (a partial last row block and key tile, masked). O and lse (cheap, and a check
of m and l); with RESIDUALS also O' (the training forward), and in row mode the row max.

Why: the Triton forward runs 64 rows on one warpgroup, two programs per SM, and is latency-bound (docs/PERFORMANCE.md,
section 3): within a program every step waits for the one before, and only the other program's work fills the gaps.
Here each program takes FlashAttention-3's structure:

- a producer partition (1 warp, 24 registers) copies the K and V tiles by TMA (descriptors made in the kernel, in
  the partition that uses them) into a ring of STAGES stages, each stage with its own "ready" and "empty" mbarriers
  for K and for V, so that a K tile can be refilled as soon as its S product is done, before its V tile is read;
- CONSUMERS warpgroups (1 to 3), each owning 64 query rows (its Q tile in shared memory, the A operand of S = Q K^T)
  and walking every KV tile; with 2, one's softmax and fq(P) can run while the other's products occupy the tensor
  cores: left to the warp schedulers, or with PINGPONG enforced by two more mbarriers that hand the right to issue
  products from one consumer to the other (FlashAttention-3's schedule; :func:`_take_turn`);
- inside each consumer, one tile of software pipelining: the S product of tile j and the P V product of tile j - 1
  are issued together (asynchronous wgmma), then the consumer waits for S_j alone, computes the softmax step and
  fq(P_j) while P_{j-1} V_{j-1} runs, then waits for that product and rescales O. P goes to the tensor cores from
  registers (the A operand of P V), so no P round trip through shared memory. ptxas hoists a plain
  ``wgmma.wait_group`` to the top of the tile (the P V product then overlapped only the row maximum), so the wait
  for P V is issued from inline PTX behind a branch (:func:`rescale`), which it cannot move above;
- LOOKAHEAD (a build for O alone; not launched by the plan, ``benchmarks/attention_ws.py``'s ``ws_c2_ahead``): S_{j+1}
  is issued at the top of tile j, before P_{j-1} V_{j-1}, so that it runs during tile j's softmax and the next tile
  starts on a finished S (:func:`_tile_ahead`). Its accumulator is 32 more registers a thread: the training forward's
  build spills, O alone's does not. The unmasked walk takes two tiles an iteration, so that S_{j+1} and P_j alternate
  between two sets of registers instead of being copied at the loop's end (ptxas serializes every wgmma of a loop
  where a register move reads a product still in flight);
- fq(P)'s block scales once per quad (:func:`fq_probs_quad`): the 4 lanes that share a block exchange their partial
  maxima so that each lane finishes one block's maximum, scale and reciprocal, and the 4 are gathered back (3 + 8
  shuffles a row, against 8 for the maxima alone and 4 scales and reciprocals a lane before);
- the rescale of O (64 multiplies a thread and tile at D = 128) is skipped by a warp whose 16 rows all kept their
  maximum (every alpha exactly 1: the product would leave the same bits), which is most tiles of a long walk.

Resources (sm_90, offline build, ``benchmarks/attention_ws.py --compile-only``): two consumers take 12 warps (the
producer's warpgroup holds 1 working warp) at a launch count of 168 registers, redistributed by ``setmaxnreg`` to 240
per consumer thread and 24 for the producer; D = 128 with 3 stages uses 128 KB of shared memory (Q 2 x 16 KB, K and
V 3 x 2 x 16 KB), one program per SM. One consumer: 8 warps at 128 registers (232 for the consumer), 112 KB, two
programs per SM. No spills; the KV loop is 772 instructions per consumer and tile at D = 128, 707 where the warp
skips the rescale (the Triton O-alone forward: 809), with no shared-memory traffic besides the operands (every layout
conversion is free, asserted when traced). On an H100 its O is bit-equal to the Triton forward's on
``benchmarks/attention_ws.py``'s check cases; the one-consumer variant faults when timed at 4096 tokens (the benchmark
leaves it out), so the plan launches two consumers.

Numerics: the Triton kernel's expressions on the same FP32 values, tile by tile in key order: ``s = mul_rn(q . k,
scale * log2 e)`` (``attention_common.mul_rn``), ``m' = max(m, rowmax s)``, ``p = exp2(s - m')``, ``alpha =
exp2(m - m')``, ``l = l * alpha + rowsum p``, ``acc = acc * alpha + fq(p) V`` with fq(P) as ``fq_probs`` computes
it (its quotient path's expressions, :func:`fq_probs_quad`; on the accumulator layout of S a block of 16 keys lies
across the 4 lanes of a quad), and at the end
``O = bf16(acc * div_rn(1, l))``, ``lse = (m + log2 l) * ln 2``. The row sums and the products' internal order may
differ from the Triton kernel's (FP32 rounding only), so O agrees to FP32 rounding, or by an fq(P) code where a
probability sits on a rounding boundary.

Barrier protocol (per stage ``st``, its n-th use ``n = tile // STAGES``, parity ``n & 1``):

- ``k_ready[st]`` / ``v_ready[st]`` (count 1): the producer's ``expect`` (an arrive with the tile's byte count),
  completed by the TMA copy; consumers wait for parity ``n & 1``.
- ``k_empty[st]`` / ``v_empty[st]`` (count CONSUMERS): each consumer arrives once when its product that read the
  buffer has completed (``warpgroup_mma_wait``); the producer waits for parity ``(n & 1) ^ 1`` before its n-th fill,
  which passes at once for n = 0 (a fresh mbarrier counts as having completed the phase before phase 0) and waits
  for the consumers' (n - 1)-th release otherwise. K and V are read by wgmma (the async proxy), the same proxy as the
  TMA writes, so no proxy fence sits between a release and the next fill.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
  fence_async_shared,
  mbarrier,
  tma,
  warpgroup_mma,
  warpgroup_mma_wait,
)

from jqat.kernels_triton.attention_common import LN2, LOG2_P_ROW_RANGE, LOG2E, mul_rn
from jqat.kernels_triton.nvfp4 import corrected_quotient, quant_flags, round_e2m1

BLOCK_N = 64  # keys per KV tile (part of the function: fq(P) is relative to the running max at each tile)
WG_ROWS = gl.constexpr(64)  # query rows per consumer warpgroup (the M of one wgmma on 4 warps)
HEAD_DIMS = (64, 96, 128)  # 96 on tiles of 128 channels (the copies read zeros past 96)
PRODUCER_REGS = gl.constexpr(24)  # the least a warp may be given (setmaxnreg); the producer holds a few scalars
REGISTER_FILE = 65536  # 32-bit registers per SM


@gluon.constexpr_function
def acc_layout(n):
  """The wgmma accumulator layout of a [64, n] product on one warpgroup (instruction m64 n k16)."""
  return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, int(n), 16])


@gluon.constexpr_function
def _acc_linear(n, reg):
  """:func:`acc_layout` of ``[64, n]`` as a linear layout with the register bases ``reg`` (in that order): the lanes
  and warps as wgmma places them (a quad's 4 lanes step 2 columns, 8 quads 8 rows; the 4 warps 16 rows each)."""
  return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
                                    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, int(n)])


@gluon.constexpr_function
def acc_regs_layout(n):
  """:func:`acc_layout` written out as a linear layout (the same bases in the same order): register 0 is column 0
  of row ``lane / 4``, register 1 the next column, register 2 the row 8 below, then the column groups of 8."""
  return _acc_linear(n, [[0, 1], [8, 0]] + [[0, 8 << i] for i in range((int(n) // 8).bit_length() - 1)])


@gluon.constexpr_function
def row_layout(n):
  """:func:`acc_layout` with its registers reordered: a thread's ``n / 4`` values of one row come first, in column
  order (so that ``pack = n / 4`` hands one row's values to one inline-asm call), then its second row (+8). The same
  values in the same threads: converting between the two moves no data."""
  return _acc_linear(n, [[0, 1], [0, 8]] + [[0, 16 << i] for i in range((int(n) // 16).bit_length() - 1)] + [[8, 0]])


def _constraints(outputs: int, inputs: int) -> str:
  """Inline-asm constraints of ``outputs`` and then ``inputs`` 32-bit registers."""
  return ",".join(["=r"] * outputs + ["r"] * inputs)


def _quad_scales_asm(n):
  """PTX of one row's E4M3 block scales and their approximate reciprocals for :func:`fq_probs_quad` (``n`` keys:
  ``n / 16`` blocks, 4 values of each block in this thread, in :func:`row_layout`'s order). Each thread reduces its 4
  values of each block; a transposed exchange across the quad (two rounds of butterfly shuffles, 3 in all) leaves lane
  ``t`` with block ``t``'s maximum; that lane forms the scale as ``e4m3_block_scale`` does on its compiled path and
  its ``rcp.approx``; 8 indexed shuffles give every lane all four. Operands: the scales and reciprocals for each of
  the row's values (outputs), then the values."""
  nb = n // 16
  assert nb == 4
  lines = ["{", ".reg .f32 m0, m1, m2, m3, k0, k1, x0, x1, y0, y1, a, q, t, s, r, s0, s1, s2, s3, r0, r1, r2, r3;",
           ".reg .b32 lane, tb;", ".reg .pred hi, lo;", ".reg .b16 e8, hl, hh;", ".reg .b32 h2;",
           "mov.u32 lane, %laneid;",
           "and.b32 tb, lane, 2;", "setp.ne.u32 hi, tb, 0;", "and.b32 tb, lane, 1;", "setp.ne.u32 lo, tb, 0;"]
  k = n // 4  # operands: s (k outputs), r (k outputs), then p (k inputs)
  for b in range(nb):
    v = [f"${2 * k + 4 * b + i}" for i in range(4)]
    lines += [f"max.f32 m{b}, {v[0]}, {v[1]};", f"max.f32 m{b}, m{b}, {v[2]};", f"max.f32 m{b}, m{b}, {v[3]};"]
  lines += [
      # lanes 0, 1 of a quad keep blocks 0 and 1 and send 2 and 3; lanes 2, 3 the other way round
      "selp.f32 k0, m2, m0, hi;", "selp.f32 k1, m3, m1, hi;", "selp.f32 x0, m0, m2, hi;", "selp.f32 x1, m1, m3, hi;",
      "shfl.sync.bfly.b32 y0, x0, 2, 0x1f, 0xffffffff;", "shfl.sync.bfly.b32 y1, x1, 2, 0x1f, 0xffffffff;",
      "max.f32 k0, k0, y0;", "max.f32 k1, k1, y1;",
      # then lane t keeps block t
      "selp.f32 a, k1, k0, lo;", "selp.f32 x0, k0, k1, lo;", "shfl.sync.bfly.b32 y0, x0, 1, 0x1f, 0xffffffff;",
      "max.f32 a, a, y0;",
      # e4m3_block_scale (compiled path): e4m3(max(RN(min(amax, 2688) / 6), 2**-9)), and its rcp.approx
      "min.f32 a, a, 0f45280000;", "mul.f32 q, a, 0f3E2AAAAB;", "fma.rn.f32 t, q, 0fC0C00000, a;",
      "fma.rn.f32 t, t, 0f3E2AAAAB, q;", "max.f32 t, t, 0f3B000000;",
      "cvt.rn.satfinite.e4m3x2.f32 e8, t, t;", "cvt.rn.f16x2.e4m3x2 h2, e8;", "mov.b32 {hl, hh}, h2;",
      "cvt.f32.f16 s, hl;", "rcp.approx.ftz.f32 r, s;"]
  for b in range(nb):
    lines += [f"shfl.sync.idx.b32 s{b}, s, {b}, 0x1c1f, 0xffffffff;",
              f"shfl.sync.idx.b32 r{b}, r, {b}, 0x1c1f, 0xffffffff;"]
  for b in range(nb):
    for i in range(4):
      lines += [f"mov.b32 ${4 * b + i}, s{b};", f"mov.b32 ${k + 4 * b + i}, r{b};"]
  return "\n".join(lines + ["}"])


@gluon.jit
def fq_probs_quad(p, HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr):
  """``fq_probs(p)`` for ``p: [64, n]`` in S's accumulator layout, each block's E4M3 scale and its reciprocal formed
  once per quad (:func:`_quad_scales_asm`: a thread's 4 values of each of a row's blocks, the 4 lanes of a quad holding
  a block's 16) instead of by every lane of the quad; then ``fq_probs``'s quotient path per element. The same
  values: the maximum is exact in any order, the scale the same expressions (``e4m3_block_scale``)."""
  n: gl.constexpr = p.shape[1]
  gl.static_assert(n == 64, "_QUAD_ASM is built for tiles of 64 keys")
  L: gl.constexpr = p.type.layout
  p16 = gl.convert_layout(p, row_layout(n))
  s, r = gl.inline_asm_elementwise(asm=_QUAD_ASM, constraints=_QUAD_CONSTRAINTS,
                                   args=[p16], dtype=(gl.float32, gl.float32), is_pure=True, pack=n // 4)
  y = corrected_quotient(p16, s, r)
  out = round_e2m1(gl.minimum(y, 6.0)) * s
  return gl.convert_layout(out, L)


_QUAD_ASM = gl.constexpr(_quad_scales_asm(64))
_QUAD_CONSTRAINTS = gl.constexpr(_constraints(32, 16))


def _rescale_asm(n):
  """PTX that waits for the last product (``wgmma.wait_group 0``) and returns ``acc * alpha`` on a thread's ``n``
  accumulators in :func:`acc_regs_layout` (operands: n outputs, the n accumulators, their n row factors; elements 0
  and 2 are the thread's two rows). Where every factor of the warp is exactly 1 the product would change nothing (the
  same bits, NaN included), and a branch skips it. The wait sits after the branch, in both arms: ptxas otherwise
  hoists it to the top of the tile, so that the P V product no longer overlaps the softmax."""
  lines = ["{", ".reg .pred p;", f"setp.eq.f32 p, ${2 * n}, 0f3F800000;",
           f"setp.eq.and.f32 p, ${2 * n + 2}, 0f3F800000, p;", "vote.sync.all.pred p, p, 0xffffffff;",
           "@p bra.uni SKIP;", "wgmma.wait_group.sync.aligned 0;"]
  lines += [f"mul.f32 ${i}, ${n + i}, ${2 * n + i};" for i in range(n)]
  lines += ["bra.uni DONE;", "SKIP:", "wgmma.wait_group.sync.aligned 0;"]
  lines += [f"mov.b32 ${i}, ${n + i};" for i in range(n)]
  lines += ["DONE:", "}"]
  return "\n".join(lines)


_RESCALE_ASM_64 = gl.constexpr(_rescale_asm(32))  # D = 64: 32 accumulators a thread
_RESCALE_ASM_128 = gl.constexpr(_rescale_asm(64))
_RESCALE_CONSTRAINTS_64 = gl.constexpr(_constraints(32, 64))
_RESCALE_CONSTRAINTS_128 = gl.constexpr(_constraints(64, 128))


@gluon.jit
def rescale(acc, alpha):
  """Waits for the P V product in flight (:func:`_rescale_asm`), then ``acc * alpha[:, None]``, skipped by whole warps
  whose rows' maxima all stayed (alpha exactly 1)."""
  L: gl.constexpr = acc.type.layout
  R: gl.constexpr = acc_regs_layout(acc.shape[1])
  acc, a = gl.broadcast(acc, alpha[:, None])
  acc = gl.convert_layout(acc, R, assert_trivial=True)
  a = gl.convert_layout(a, R, assert_trivial=True)
  if acc.shape[1] == 128:
    out = gl.inline_asm_elementwise(asm=_RESCALE_ASM_128, constraints=_RESCALE_CONSTRAINTS_128, args=[acc, a],
                                    dtype=gl.float32, is_pure=False, pack=64)
  else:
    out = gl.inline_asm_elementwise(asm=_RESCALE_ASM_64, constraints=_RESCALE_CONSTRAINTS_64, args=[acc, a],
                                    dtype=gl.float32, is_pure=False, pack=32)
  return gl.convert_layout(out, L, assert_trivial=True)


@gluon.constexpr_function
def tile_smem_layout(rows, cols):
  """NVMMA shared layout of a [rows, cols] bf16 tile (128-byte swizzle at 64 and 128 columns): what TMA writes and
  wgmma reads."""
  return gl.NVMMASharedLayout.get_default_for([int(rows), int(cols)], gl.bfloat16)


@gluon.constexpr_function
def q_load_layout(head_dim):
  """Q as loaded from global memory: 16 bytes a thread along D, a row of D per 8 or 16 lanes."""
  lanes = int(head_dim) // 8
  return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [4, 1], [1, 0])


def registers(consumers: int) -> tuple[int, int]:
  """``(maxnreg, consumer registers)`` of a launch with ``consumers`` consumer warpgroups.

  Registers are allocated per warpgroup: the 1-warp producer occupies a warpgroup of its own, so a program is
  ``consumers + 1`` warpgroups. ``maxnreg`` is the launch's per-thread count (what the SM reserves); inside the
  program ``setmaxnreg`` moves the producer down to PRODUCER_REGS and gives the rest to the consumers. One consumer:
  two programs per SM (8 warpgroups at 128 registers), as the Triton forward runs two programs of one warpgroup.
  Two consumers: one program of 128 rows per SM (3 warpgroups at 168); three: one of 192 rows (4 warpgroups at 128,
  160 registers a consumer thread: enough at D = 64)."""
  per_sm = 2 if consumers == 1 else 1
  maxnreg = REGISTER_FILE // (per_sm * (consumers + 1) * 128) // 8 * 8
  consumer = ((consumers + 1) * maxnreg - PRODUCER_REGS) // consumers // 8 * 8
  return maxnreg, min(consumer, 256)


@gluon.jit
def _softmax_step(s, m, l, qk_scale, O_LAYOUT: gl.constexpr, HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr,
                  MASKED: gl.constexpr, CAUSAL: gl.constexpr, RESIDUALS: gl.constexpr, ROW: gl.constexpr, row0, j,
                  tk):
  """One KV tile's online-softmax step on the raw scores ``s = q . k`` (FP32 [64, BLOCK_N], S's accumulator layout):
  returns the new running max, the new row sum, the rescale ``alpha`` of the old state (in O's row layout) and the A
  operands of the P V products in bf16: ``(fq(P),)``, with RESIDUALS ``(fq(P), bf16(P))`` (O' is bf16(P) V). The
  Triton kernel's expressions (``attention_fwd._kv_tile``, unmasked), in its order. ROW (p_scale "row"): the tile
  is R * p, ``exp2(s - (m' - log2 R))``, so that l sums R * p and the operands are fq(R p) and bf16(R p). MASKED
  (tile ``j``): keys from ``tk`` on (the copy's zeros past the sequence) and, with CAUSAL (top-left), keys past a row
  are hidden: score -inf, p exactly +0."""
  s = mul_rn(s, qk_scale, False)  # log2 units, rounded once: the max's p is exp2(0) = 1 exactly
  if MASKED:
    S_LAYOUT: gl.constexpr = s.type.layout
    keys = j * s.shape[1] + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, S_LAYOUT))
    visible = keys[None, :] < tk
    if CAUSAL:
      rows = row0 + gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, S_LAYOUT))
      visible = visible & (keys[None, :] <= rows[:, None])
    s = gl.where(visible, s, float("-inf"))
  m_new = gl.maximum(m, gl.max(s, axis=1))
  m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
  if ROW:
    p = gl.exp2(s - (m_safe - LOG2_P_ROW_RANGE)[:, None])
  else:
    p = gl.exp2(s - m_safe[:, None])
  alpha = gl.exp2(m - m_safe)
  l = l * alpha + gl.sum(p, axis=1)
  p_fq = fq_probs_quad(p, HW_E4M3, HW_E2M1)  # exact in bf16 (E2M1 x E4M3)
  # The accumulator layout of S is the register layout of the next wgmma's A operand (16-bit, k_width 2): free.
  OPERAND: gl.constexpr = gl.DotOperandLayout(0, O_LAYOUT, 2)
  p_op = gl.convert_layout(p_fq.to(gl.bfloat16), OPERAND, assert_trivial=True)
  alpha = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT), assert_trivial=True)
  ops = (p_op,)
  if RESIDUALS:
    ops = (p_op, gl.convert_layout(p.to(gl.bfloat16), OPERAND, assert_trivial=True))
  return m_new, l, alpha, ops


@gluon.jit
def _take_turn(turns, WG: gl.constexpr, i, PINGPONG: gl.constexpr):
  """With PINGPONG, waits until it is warpgroup WG's ``i``-th turn to issue its products: turns alternate, consumer
  0 first. Its i-th wait is for parity ``(i & 1) ^ 1`` (WG 0: its first passes at once) or ``i & 1`` (WG 1: its
  first waits for WG 0's first hand-over) on ``turns[WG]``."""
  if PINGPONG:
    mbarrier.wait(turns.index(WG), (i & 1) ^ (1 - WG))


@gluon.jit
def _pass_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
  """With PINGPONG, hands the turn to the other consumer, once this one's products are issued (not completed)."""
  if PINGPONG:
    mbarrier.arrive(turns.index(1 - WG))


@gluon.jit
def _pv_products(accs, ops, v_bufs, sp, RESIDUALS: gl.constexpr):
  """Issues acc += fq(P) V (with RESIDUALS also acc' += bf16(P) V) on the V tile in stage ``sp``, asynchronously: the
  tokens of the products, ``(acc,)`` or ``(acc, acc')`` in flight."""
  toks = (warpgroup_mma(ops[0], v_bufs.index(sp), accs[0], is_async=True),)
  if RESIDUALS:
    toks = (toks[0], warpgroup_mma(ops[1], v_bufs.index(sp), accs[1], is_async=True))
  return toks


@gluon.jit
def _softmax_and_rescale(s, m, l, ops, toks, v_empty, sp, qk_scale, row0, j, tk, PENDING: gl.constexpr,
                         MASKED: gl.constexpr, CAUSAL: gl.constexpr, RESIDUALS: gl.constexpr, ROW: gl.constexpr,
                         O_LAYOUT: gl.constexpr, HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr):
  """The rest of KV tile ``j`` once its S is done: the softmax step (:func:`_softmax_step`) while the P V products
  ``toks`` (:func:`_pv_products`) run, ``PENDING`` wgmma groups being in flight, then the rescale of their
  accumulators, and the release of their V buffer (stage ``sp``). Returns ``(m, l, accs, the operands of
  tile j)``."""
  m, l, alpha, nxt = _softmax_step(s, m, l, qk_scale, O_LAYOUT, HW_E4M3, HW_E2M1, MASKED, CAUSAL, RESIDUALS, ROW,
                                   row0, j, tk)
  # A wait for nothing new (PENDING: the groups in flight): it hands out the accumulators' registers, and orders the
  # next operands before the rescale, which waits for the products itself
  if RESIDUALS:
    acc, acc_hp, _, _, p0, p1 = warpgroup_mma_wait(PENDING, deps=[toks[0], toks[1], ops[0], ops[1], nxt[0], nxt[1]])
    accs = (rescale(acc, alpha), rescale(acc_hp, alpha))
    nxt = (p0, p1)
  else:
    acc, _, p0 = warpgroup_mma_wait(PENDING, deps=[toks[0], ops[0], nxt[0]])
    accs = (rescale(acc, alpha),)
    nxt = (p0,)
  mbarrier.arrive(v_empty.index(sp))
  return m, l, accs, nxt


@gluon.jit
def _tile(j, m, l, accs, ops, q_s, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turns, s_init, qk_scale, row0,
          tk, WG: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, MASKED: gl.constexpr,
          CAUSAL: gl.constexpr, RESIDUALS: gl.constexpr, ROW: gl.constexpr, O_LAYOUT: gl.constexpr,
          HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr):
  """KV tile ``j > 0`` of a consumer: S_j = Q K_j^T and acc += fq(P_{j-1}) V_{j-1} (with RESIDUALS also acc' +=
  bf16(P_{j-1}) V_{j-1}) in flight together (wgmma groups complete in issue order), the softmax step of S_j (masked
  with MASKED) while the P V products run, then the rescale of the accumulators. ``accs``: ``(acc,)`` or ``(acc,
  acc')``, ``ops`` their A operands (:func:`_softmax_step`). Returns ``(m, l, accs, the operands of tile j)``."""
  st = j % STAGES
  sp = (j - 1) % STAGES
  mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
  mbarrier.wait(v_ready.index(sp), ((j - 1) // STAGES) & 1)
  _take_turn(turns, WG, j, PINGPONG)
  s_tok = warpgroup_mma(q_s, k_bufs.index(st).permute((1, 0)), s_init, use_acc=False, is_async=True)
  toks = _pv_products(accs, ops, v_bufs, sp, RESIDUALS)
  _pass_turn(turns, WG, PINGPONG)
  s = warpgroup_mma_wait(1 + RESIDUALS, deps=[s_tok])  # S_j done (P V may still run)
  mbarrier.arrive(k_empty.index(st))
  return _softmax_and_rescale(s, m, l, ops, toks, v_empty, sp, qk_scale, row0, j, tk, 1 + RESIDUALS, MASKED,
                              CAUSAL, RESIDUALS, ROW, O_LAYOUT, HW_E4M3, HW_E2M1)


@gluon.jit
def _tile_ahead(j, m, l, accs, ops, s_cur, q_s, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, s_init, qk_scale,
                row0, tk, n_tiles, STAGES: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                RESIDUALS: gl.constexpr, ROW: gl.constexpr, O_LAYOUT: gl.constexpr, HW_E4M3: gl.constexpr,
                HW_E2M1: gl.constexpr):
  """KV tile ``j > 0`` of a consumer whose S_j was issued one tile before (``s_cur``, in flight): issues S_{j+1} and
  then acc += fq(P_{j-1}) V_{j-1} (with RESIDUALS also acc'), waits for S_j alone, computes its softmax step while
  both products run, then the rescale (whose wait for the P V products also covers S_{j+1}, issued before them). The
  last tile issues its own S again (tile ``n_tiles - 1``, never read: every issue has the same group count), without
  waiting for a copy. Returns ``(m, l, accs, the operands of tile j, S_{j+1} in flight)``."""
  st = j % STAGES
  sp = (j - 1) % STAGES
  nj = gl.minimum(j + 1, n_tiles - 1)
  sn = nj % STAGES
  if j + 1 < n_tiles:
    mbarrier.wait(k_ready.index(sn), (nj // STAGES) & 1)
  s_tok = warpgroup_mma(q_s, k_bufs.index(sn).permute((1, 0)), s_init, use_acc=False, is_async=True)
  mbarrier.wait(v_ready.index(sp), ((j - 1) // STAGES) & 1)
  toks = _pv_products(accs, ops, v_bufs, sp, RESIDUALS)
  s = warpgroup_mma_wait(2 + RESIDUALS, deps=[s_cur])  # S_j done (S_{j+1} and P V may still run)
  mbarrier.arrive(k_empty.index(st))
  # The rescale's own wait (for every group) completes S_{j+1} too
  m, l, accs, nxt = _softmax_and_rescale(s, m, l, ops, toks, v_empty, sp, qk_scale, row0, j, tk, 2 + RESIDUALS,
                                         MASKED, CAUSAL, RESIDUALS, ROW, O_LAYOUT, HW_E4M3, HW_E2M1)
  return m, l, accs, nxt, s_tok


@gluon.jit
def _consumer(WG: gl.constexpr, smem, scalars, HEAD_DIM: gl.constexpr, D_PAD: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, PINGPONG: gl.constexpr, HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr,
              IS_CAUSAL: gl.constexpr, RESIDUALS: gl.constexpr, ROW: gl.constexpr, LOOKAHEAD: gl.constexpr):
  """Consumer warpgroup WG: query rows ``[start_m + 64 WG, +64)`` of head ``h``, batch ``b``; walks the
  ``n_tiles`` KV tiles of the ring and stores O (with RESIDUALS also O', and with ROW the row max) and lse of its
  rows, on tiles of D_PAD channels (Q's past HEAD_DIM load as 0, O's are not stored). ``smem``: the shared
  buffers and barriers, ``scalars``: pointers and integers (tuples: the two consumers are one function with one
  argument list).

  PINGPONG (two consumers): the consumers issue their products in alternation (FlashAttention-3's schedule), so that
  one's softmax runs while the other's products occupy the tensor cores; otherwise the warp schedulers interleave
  them as they come. Per KV tile each consumer issues once (S_j with P_{j-1} V_{j-1}; tile 0's S alone, the last
  P V alone): ``n_tiles + 1`` turns each."""
  q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turns = smem
  (q_ptr, o_ptr, o_hp_ptr, lse_ptr, leak_ptr, m_ptr, qk_scale, n_tiles, start_m, tq, tk, b, h, n_heads, stride_qb,
   stride_qt, stride_qh, stride_ob, stride_ot, stride_oh) = scalars
  S_LAYOUT: gl.constexpr = acc_layout(BLOCK_N)
  O_LAYOUT: gl.constexpr = acc_layout(D_PAD)
  ROW_S: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
  ROW_O: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
  row0 = start_m + WG * WG_ROWS
  if IS_CAUSAL and not PINGPONG:
    # The program's last tiles past this consumer's diagonal (with two consumers, consumer 0's one) hide every key
    # from its rows (p = +0 there, no term of O, l or m), and the Triton kernel's walk of these rows ends before them.
    # This consumer stops at its diagonal and never releases them, which nothing waits for: they are the producer's
    # last fills, and a fill waits only for the release of the tile STAGES before it, which this walk made.
    n_tiles = gl.minimum(n_tiles, row0 // BLOCK_N + 1)

  # Q: global -> registers -> this warpgroup's shared tile (once). The generic-proxy stores must be made visible to
  # the async proxy (wgmma) by a fence; the compiler's barrier analysis orders the warps' stores before the product.
  QL: gl.constexpr = q_load_layout(D_PAD)
  rq = row0 + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, QL))
  cq = gl.arange(0, D_PAD, layout=gl.SliceLayout(0, QL))
  q_rows = b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qh + rq.to(gl.int64) * stride_qt
  q_ok = (rq < tq)[:, None]
  if D_PAD != HEAD_DIM:
    q_ok = q_ok & (cq < HEAD_DIM)[None, :]
  q = gl.load(q_ptr + q_rows[:, None] + cq[None, :], mask=q_ok, other=0.0)  # rows past tq, channels past D: 0
  q_s = q_smem.index(WG)
  q_s.store(q)
  fence_async_shared()

  m = gl.full([WG_ROWS], float("-inf"), gl.float32, layout=ROW_S)
  l = gl.zeros([WG_ROWS], gl.float32, layout=ROW_S)
  acc = gl.zeros([WG_ROWS, D_PAD], gl.float32, layout=O_LAYOUT)
  accs = (acc, acc) if RESIDUALS else (acc,)  # O's accumulator, and O''s
  s_init = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, layout=S_LAYOUT)  # not read: use_acc=False

  # Tile 0: S alone (acc is 0: its rescale by alpha = 0 changes nothing); with LOOKAHEAD S_1 follows it at once
  # (tile 0's again where it is the only one, never read).
  mbarrier.wait(k_ready.index(0), 0)
  _take_turn(turns, WG, 0, PINGPONG)
  s_tok = warpgroup_mma(q_s, k_bufs.index(0).permute((1, 0)), s_init, use_acc=False, is_async=True)
  _pass_turn(turns, WG, PINGPONG)
  if LOOKAHEAD:
    n1 = gl.minimum(n_tiles - 1, 1)
    if n_tiles > 1:
      mbarrier.wait(k_ready.index(n1 % STAGES), 0)
    s_ahead = warpgroup_mma(q_s, k_bufs.index(n1 % STAGES).permute((1, 0)), s_init, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(1, deps=[s_tok])
  else:
    s = warpgroup_mma_wait(0, deps=[s_tok])
  mbarrier.arrive(k_empty.index(0))
  # Tile 0 masked (the keys past tk when it is the last, the causal mask), then the whole tiles before the first that
  # the mask reaches unmasked, the rest masked: with IS_CAUSAL from the first that holds a key past row0, and the
  # last when tk is not a multiple of BLOCK_N.
  m, l, alpha, ops = _softmax_step(s, m, l, qk_scale, O_LAYOUT, HW_E4M3, HW_E2M1, True, IS_CAUSAL, RESIDUALS, ROW,
                                   row0, 0, tk)
  if LOOKAHEAD:
    # S_1 complete before the walks: it may pass to the second loop (or none) without going through the first, and
    # ptxas serializes every wgmma where a register move reads a product still in flight
    m = warpgroup_mma_wait(0, deps=[m])
  split = tk // BLOCK_N
  if IS_CAUSAL:
    split = gl.minimum(split, row0 // BLOCK_N)
  if LOOKAHEAD:
    # The unmasked walk two tiles an iteration, so that S_{j+1}'s accumulator and P_j's operand alternate between two
    # sets of registers instead of being copied at the loop's end (an odd last unmasked tile goes to the masked walk,
    # where its mask hides nothing).
    pairs = gl.maximum(split - 1, 0) // 2
    for i in range(0, pairs):
      j = 1 + 2 * i
      m, l, accs, ops, s_next = _tile_ahead(j, m, l, accs, ops, s_ahead, q_s, k_bufs, v_bufs, k_ready, v_ready,
                                            k_empty, v_empty, s_init, qk_scale, row0, tk, n_tiles, STAGES, False,
                                            IS_CAUSAL, RESIDUALS, ROW, O_LAYOUT, HW_E4M3, HW_E2M1)
      m, l, accs, ops, s_ahead = _tile_ahead(j + 1, m, l, accs, ops, s_next, q_s, k_bufs, v_bufs, k_ready, v_ready,
                                             k_empty, v_empty, s_init, qk_scale, row0, tk, n_tiles, STAGES, False,
                                             IS_CAUSAL, RESIDUALS, ROW, O_LAYOUT, HW_E4M3, HW_E2M1)
    for j in range(1 + 2 * pairs, n_tiles):
      m, l, accs, ops, s_ahead = _tile_ahead(j, m, l, accs, ops, s_ahead, q_s, k_bufs, v_bufs, k_ready, v_ready,
                                             k_empty, v_empty, s_init, qk_scale, row0, tk, n_tiles, STAGES, True,
                                             IS_CAUSAL, RESIDUALS, ROW, O_LAYOUT, HW_E4M3, HW_E2M1)
  else:
    for j in range(1, split):
      m, l, accs, ops = _tile(j, m, l, accs, ops, q_s, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turns,
                              s_init, qk_scale, row0, tk, WG, STAGES, PINGPONG, False, IS_CAUSAL, RESIDUALS, ROW,
                              O_LAYOUT, HW_E4M3, HW_E2M1)
    for j in range(gl.maximum(split, 1), n_tiles):
      m, l, accs, ops = _tile(j, m, l, accs, ops, q_s, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turns,
                              s_init, qk_scale, row0, tk, WG, STAGES, PINGPONG, True, IS_CAUSAL, RESIDUALS, ROW,
                              O_LAYOUT, HW_E4M3, HW_E2M1)

  sp = (n_tiles - 1) % STAGES
  mbarrier.wait(v_ready.index(sp), ((n_tiles - 1) // STAGES) & 1)
  _take_turn(turns, WG, n_tiles, PINGPONG)
  o_tok = warpgroup_mma(ops[0], v_bufs.index(sp), accs[0], is_async=True)
  if RESIDUALS:
    h_tok = warpgroup_mma(ops[1], v_bufs.index(sp), accs[1], is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    acc, acc_hp = warpgroup_mma_wait(0, deps=[o_tok, h_tok])
  else:
    _pass_turn(turns, WG, PINGPONG)
    acc = warpgroup_mma_wait(0, deps=[o_tok])
  mbarrier.arrive(v_empty.index(sp))

  # Epilogue (``attention_fwd._store_outputs``): O = acc / l (and O' = acc' / l) rounded to bf16, lse = m + ln l
  # (ROW: l sums R * p, so 1 / l is already 1 / (R sum p), and lse takes log2 R off).
  empty = l == 0.0
  inv = gl.where(empty, 0.0, gl.div_rn(gl.full([WG_ROWS], 1.0, gl.float32, layout=ROW_S), gl.where(empty, 1.0, l)))
  inv = gl.convert_layout(inv, ROW_O, assert_trivial=True)
  empty_o = gl.convert_layout(empty, ROW_O, assert_trivial=True)
  acc = gl.where(empty_o[:, None], 0.0, acc)
  ro = row0 + gl.arange(0, WG_ROWS, layout=ROW_O)
  co = gl.arange(0, D_PAD, layout=gl.SliceLayout(0, O_LAYOUT))
  o_rows = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + ro.to(gl.int64) * stride_ot
  keep = ro < tq
  if IS_CAUSAL:
    # A NaN that reached these rows may have come through a hidden pair of the diagonal tile (p = +0 times a NaN of
    # V): then nothing of them is stored and the flag sends the 64 rows to the Triton kernel's exact walk (its REDO
    # launch, the plan's next). Every consumer writes its flag, so the flags need no zeroing.
    checked = acc_hp if RESIDUALS else acc  # a leak reaches O and O' alike
    nan = (checked != checked) & keep[:, None]
    leaked = gl.max(gl.max(nan.to(gl.int32), axis=1), axis=0)
    row_tiles = (tq + WG_ROWS - 1) // WG_ROWS
    tile = row0 // WG_ROWS
    if tile < row_tiles:
      gl.store(leak_ptr + (b * n_heads + h).to(gl.int64) * row_tiles + tile, leaked)
    keep = keep & (leaked == 0)
  store = keep[:, None]
  if D_PAD != HEAD_DIM:
    store = store & (co < HEAD_DIM)[None, :]
  gl.store(o_ptr + o_rows[:, None] + co[None, :], (acc * inv[:, None]).to(o_ptr.dtype.element_ty), mask=store)
  if RESIDUALS:
    acc_hp = gl.where(empty_o[:, None], 0.0, acc_hp)
    gl.store(o_hp_ptr + o_rows[:, None] + co[None, :], (acc_hp * inv[:, None]).to(o_hp_ptr.dtype.element_ty),
             mask=store)
  log_l = gl.log2(gl.where(empty, 1.0, l))
  if ROW:
    log_l = log_l - LOG2_P_ROW_RANGE
  lse = gl.where(empty, float("-inf"), (m + log_l) * LN2)
  rs = row0 + gl.arange(0, WG_ROWS, layout=ROW_S)
  rows_bh = (b * n_heads + h).to(gl.int64) * tq + rs
  gl.store(lse_ptr + rows_bh, lse, mask=rs < tq)
  if ROW and RESIDUALS:
    # The row max in natural units (-inf for an empty row), NaN where lse is: the compiled max drops a NaN operand.
    row_max = gl.where(empty, float("-inf"), gl.where(lse != lse, lse, m * LN2))
    gl.store(m_ptr + rows_bh, row_max, mask=rs < tq)


@gluon.jit
def _producer(smem, kv, HEAD_DIM: gl.constexpr, D_PAD: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
  """The producer warp: TMA copies of K and V tiles ``0 .. n_tiles - 1`` of KV head ``kvh`` into the ring, boxes of
  D_PAD channels over the head's HEAD_DIM (the copy reads the channels past HEAD_DIM as zeros).

  The descriptors are made here, by the warp that uses them (their 128 bytes each in the launch's global scratch),
  so that the tensormap's writes, its proxy fence and the copies that read it are in one warp's program order."""
  _, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, _ = smem
  k_ptr, v_ptr, n_tiles, tk, b, kvh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh = kv
  KV_SMEM: gl.constexpr = tile_smem_layout(BLOCK_N, D_PAD)
  k_base = k_ptr + b.to(gl.int64) * stride_kb + kvh.to(gl.int64) * stride_kh
  v_base = v_ptr + b.to(gl.int64) * stride_vb + kvh.to(gl.int64) * stride_vh
  TILE_BYTES: gl.constexpr = BLOCK_N * D_PAD * 2  # a box's bytes, the zeros past HEAD_DIM included
  k_desc = tma.make_tensor_descriptor(k_base, shape=[tk, HEAD_DIM], strides=[stride_kt, 1],
                                      block_shape=[BLOCK_N, D_PAD], layout=KV_SMEM)
  # Tile 0's K copy goes out before V's descriptor is made (its global write and proxy fences): the first S product
  # waits for one descriptor, not two. Stage 0's first fill needs no wait (a fresh "empty" barrier).
  mbarrier.expect(k_ready.index(0), TILE_BYTES)
  tma.async_copy_global_to_shared(k_desc, [0, 0], k_ready.index(0), k_bufs.index(0))
  v_desc = tma.make_tensor_descriptor(v_base, shape=[tk, HEAD_DIM], strides=[stride_vt, 1],
                                      block_shape=[BLOCK_N, D_PAD], layout=KV_SMEM)
  mbarrier.expect(v_ready.index(0), TILE_BYTES)
  tma.async_copy_global_to_shared(v_desc, [0, 0], v_ready.index(0), v_bufs.index(0))
  for j in range(1, n_tiles):  # n_tiles >= 1
    st = j % STAGES
    free = ((j // STAGES) & 1) ^ 1  # the (n-1)-th release of the stage; passes at once for its first fill
    mbarrier.wait(k_empty.index(st), free)
    mbarrier.expect(k_ready.index(st), TILE_BYTES)
    tma.async_copy_global_to_shared(k_desc, [j * BLOCK_N, 0], k_ready.index(st), k_bufs.index(st))
    mbarrier.wait(v_empty.index(st), free)
    mbarrier.expect(v_ready.index(st), TILE_BYTES)
    tma.async_copy_global_to_shared(v_desc, [j * BLOCK_N, 0], v_ready.index(st), v_bufs.index(st))


@gluon.jit
def attention_fwd_ws_kernel(
    q_ptr, k_ptr, v_ptr, scale, tq, tk, n_heads, group,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ob, stride_ot, stride_oh, o_ptr, lse_ptr, leak_ptr, o_hp_ptr, m_ptr,
    HEAD_DIM: gl.constexpr, D_PAD: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr, HW_E4M3: gl.constexpr,
    HW_E2M1: gl.constexpr, IS_CAUSAL: gl.constexpr = False, RESIDUALS: gl.constexpr = False,
    P_ROW_RANGE: gl.constexpr = 0.0, LOOKAHEAD: gl.constexpr = False):
  """O (and lse) of ``64 * CONSUMERS`` query rows of one head per program: grid ``(cdiv(tq, 64 CONSUMERS), B * N)``,
  or ``(B * N, cdiv(tq, 64 CONSUMERS))`` with IS_CAUSAL (heads fastest, longest walks first). Outputs last, as the
  launch plans order arguments.

  q, o: [B, Tq, N, D] bf16; k, v: [B, Tk, K, D] bf16, N = K * group (query head h reads KV head h // group); every
  last axis contiguous, the other strides multiples of 16 elements; q, k, v already fake-quantized (fq along D).
  lse: [B, N, Tq] fp32. ``tk > 0``; rows past tq read Q as 0 and store nothing, keys past tk (the copy's zeros) are
  masked in the last tile. D = HEAD_DIM on tiles of D_PAD channels: D itself, or 128 at D = 96 (Q's channels past D
  load as 0, the copies of K and V read them as 0, O's are not stored). P_ROW_RANGE: 0 (p_scale "block") or R = 6 *
  448 ("row": fq(R p), l sums R p, lse takes log2 R off; with RESIDUALS the row max m [B, N, Tq] fp32 in natural
  units is stored through ``m_ptr``, which is None otherwise). With IS_CAUSAL, leak: [B * N, cdiv(Tq, 64)] int32,
  each consumer's flag that a NaN reached its rows' O, which it then does not store (for ``attention_fwd_kernel``'s
  REDO launch); not touched otherwise.
  Launch with ``num_warps=4`` (the default partition: consumer 0) and ``maxnreg`` of :func:`registers`; the kernel
  adds a 4-warp partition per further consumer and the producer's warp. Needs the launch's global scratch (two tensor
  descriptors a program).
  """
  gl.static_assert(HEAD_DIM == D_PAD or (HEAD_DIM == 96 and D_PAD == 128), "tiles of D channels, or 128 at D = 96")
  gl.static_assert(D_PAD == 64 or D_PAD == 128, "tiles of 64 or 128 channels")
  gl.static_assert(P_ROW_RANGE == 0.0 or P_ROW_RANGE == 6.0 * 448.0, "LOG2_P_ROW_RANGE is log2(6 * 448)")
  ROW: gl.constexpr = P_ROW_RANGE > 0
  gl.static_assert(BLOCK_N == 64, "KV tiles of 64 keys")
  gl.static_assert(CONSUMERS >= 1 and CONSUMERS <= 3, "one to three consumer warpgroups")
  gl.static_assert(CONSUMERS == 2 or not PINGPONG, "ping-pong takes two consumers")
  gl.static_assert(not (LOOKAHEAD and PINGPONG), "the lookahead schedule takes no turns")
  gl.static_assert(STAGES >= 2, "a consumer holds two stages at once (K_j and V_{j-1})")
  gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")
  # Strides are multiples of 16 elements (D % 16 == 0 rows): shown to the compiler for 16-byte accesses.
  stride_qb, stride_qt, stride_qh = stride_qb // 16 * 16, stride_qt // 16 * 16, stride_qh // 16 * 16
  stride_kb, stride_kt, stride_kh = stride_kb // 16 * 16, stride_kt // 16 * 16, stride_kh // 16 * 16
  stride_vb, stride_vt, stride_vh = stride_vb // 16 * 16, stride_vt // 16 * 16, stride_vh // 16 * 16
  stride_ob, stride_ot, stride_oh = stride_ob // 16 * 16, stride_ot // 16 * 16, stride_oh // 16 * 16
  if IS_CAUSAL:  # grid (B * N, row blocks): heads fastest, the longest walks (last row blocks) launched first
    pid_bh = gl.program_id(0)
    pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
  else:
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
  b = pid_bh // n_heads
  h = pid_bh % n_heads
  kvh = h // group
  start_m = pid_m * (WG_ROWS * CONSUMERS)
  n_tiles = gl.cdiv(tk, BLOCK_N)  # the last one partial where tk is not a multiple of BLOCK_N (masked)
  if IS_CAUSAL:  # top-left: the program's last row sees keys up to start_m + 64 CONSUMERS - 1
    n_tiles = gl.minimum(n_tiles, (start_m + WG_ROWS * CONSUMERS) // BLOCK_N)
  qk_scale = scale * LOG2E  # as the Triton kernel forms it: one FP32 product

  TILE: gl.constexpr = tile_smem_layout(BLOCK_N, D_PAD)
  q_smem = gl.allocate_shared_memory(gl.bfloat16, [CONSUMERS, WG_ROWS, D_PAD], tile_smem_layout(WG_ROWS, D_PAD))
  k_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_PAD], TILE)
  v_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_PAD], TILE)
  k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
  v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
  k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
  v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
  turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
  for i in gl.static_range(2):
    mbarrier.init(turns.index(i), count=1)
  for i in gl.static_range(STAGES):
    mbarrier.init(k_ready.index(i), count=1)
    mbarrier.init(v_ready.index(i), count=1)
    mbarrier.init(k_empty.index(i), count=CONSUMERS)
    mbarrier.init(v_empty.index(i), count=CONSUMERS)

  smem = (q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, turns)
  scalars = (q_ptr, o_ptr, o_hp_ptr, lse_ptr, leak_ptr, m_ptr, qk_scale, n_tiles, start_m, tq, tk, b, h, n_heads,
             stride_qb, stride_qt, stride_qh, stride_ob, stride_ot, stride_oh)
  # (Constexprs go into the argument tuples where they are written: a tuple assigned to a variable turns them into
  # tensors.)
  kv = (k_ptr, v_ptr, n_tiles, tk, b, kvh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh)
  if CONSUMERS == 3:
    gl.warp_specialize([(_consumer, (0, smem, scalars, HEAD_DIM, D_PAD, BLOCK_N, STAGES, PINGPONG, HW_E4M3,
                                     HW_E2M1, IS_CAUSAL, RESIDUALS, ROW, LOOKAHEAD)),
                        (_consumer, (1, smem, scalars, HEAD_DIM, D_PAD, BLOCK_N, STAGES, PINGPONG, HW_E4M3,
                                     HW_E2M1, IS_CAUSAL, RESIDUALS, ROW, LOOKAHEAD)),
                        (_consumer, (2, smem, scalars, HEAD_DIM, D_PAD, BLOCK_N, STAGES, PINGPONG, HW_E4M3,
                                     HW_E2M1, IS_CAUSAL, RESIDUALS, ROW, LOOKAHEAD)),
                        (_producer, (smem, kv, HEAD_DIM, D_PAD, BLOCK_N, STAGES))], [4, 4, 1],
                       [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
  elif CONSUMERS == 2:
    gl.warp_specialize([(_consumer, (0, smem, scalars, HEAD_DIM, D_PAD, BLOCK_N, STAGES, PINGPONG, HW_E4M3,
                                     HW_E2M1, IS_CAUSAL, RESIDUALS, ROW, LOOKAHEAD)),
                        (_consumer, (1, smem, scalars, HEAD_DIM, D_PAD, BLOCK_N, STAGES, PINGPONG, HW_E4M3,
                                     HW_E2M1, IS_CAUSAL, RESIDUALS, ROW, LOOKAHEAD)),
                        (_producer, (smem, kv, HEAD_DIM, D_PAD, BLOCK_N, STAGES))], [4, 1],
                       [CONSUMER_REGS, PRODUCER_REGS])
  else:
    gl.warp_specialize([(_consumer, (0, smem, scalars, HEAD_DIM, D_PAD, BLOCK_N, STAGES, PINGPONG, HW_E4M3,
                                     HW_E2M1, IS_CAUSAL, RESIDUALS, ROW, LOOKAHEAD)),
                        (_producer, (smem, kv, HEAD_DIM, D_PAD, BLOCK_N, STAGES))], [1], [PRODUCER_REGS])


def launch_params(head_dim: int, stages: int = 3, consumers: int = 2, pingpong: bool = False,
                  compute_capability=(9, 0), is_causal: bool = False, residuals: bool = False,
                  p_row_range: float = 0.0, lookahead: bool = False) -> dict:
  """Constexprs and launch options of :func:`attention_fwd_ws_kernel` (without ``residuals`` o_hp_ptr is None: the
  launch has no O' output; m_ptr is None unless ``residuals`` in row mode, ``p_row_range`` > 0)."""
  maxnreg, consumer_regs = registers(consumers)
  flags = quant_flags(compute_capability)
  row_max = residuals and p_row_range > 0
  return {"HEAD_DIM": head_dim, "D_PAD": 128 if head_dim == 96 else head_dim, "BLOCK_N": BLOCK_N, "STAGES": stages,
          "CONSUMERS": consumers, "PINGPONG": bool(pingpong and consumers == 2),
          "CONSUMER_REGS": consumer_regs, "HW_E4M3": flags["HW_E4M3"], "HW_E2M1": flags["HW_E2M1"],
          "IS_CAUSAL": bool(is_causal), "RESIDUALS": bool(residuals), "P_ROW_RANGE": float(p_row_range),
          "LOOKAHEAD": bool(lookahead),
          **({} if residuals else {"o_hp_ptr": None}), **({} if row_max else {"m_ptr": None}),
          "num_warps": 4, "maxnreg": maxnreg}
