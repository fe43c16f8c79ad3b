"""Decode attention over the packed NVFP4 KV cache, written in Gluon (docs/NUMERICS.md, section 10; docs/PERFORMANCE.md,
section 10).

The same function as :func:`jqat.kernels_triton.decode.decode_split_kernel` (same arguments, same outputs, same
fq(Q), fq(P) per tile relative to the running max, same partials for ``decode_combine_kernel``), for the shapes where
it pays: compiled sm_89+ code (the E4M3 conversion), quantized Q and P, D of 64 or 128, KV tiles of 64 keys, at most
16 query rows per KV head, a contiguous cache or pages of a multiple of 64 rows. Why Gluon: the Triton kernel spends
about 6 instructions per cached value, a third of them moving the dequantized values from the blocked layout Triton
gives them into the tensor cores' operand layouts through shared memory (docs/PERFORMANCE.md, section 10). Here every
tensor has an explicit layout, chosen so that each thread loads exactly the code bytes of its own MMA operand
fragments and no value moves between threads or through shared memory inside the KV loop.

One program per (sequence, group of KG KV heads, split), one warp per KV head (:func:`kv_group`: KG = 2 where the
KV heads are even). The warps of a program copy the KV tiles of their KV heads together, 64 keys at a time, into
shared memory by cp.async, two or three stages deep (:func:`stages`): the group's part of each cache row (KG * D / 2
code bytes, KG * D / 16 scale bytes) is read in one contiguous piece, where one warp alone would read D / 2 bytes of
each row at the cache's token stride (docs/PERFORMANCE.md, section 10: that pattern caps the read well below what
whole rows reach). Each warp then computes its own KV head from its slice of the tiles, in layouts whose reads do not
conflict (:func:`codes_smem_layout`); tensors carry the KV head of the group as a leading axis, one warp each. Per
tile and warp:

- ``S^T = K Q^T`` (m16n8k16, FP16): the tile's keys are the M rows (in the order ``kappa``, :func:`k_words_layout`),
  the query rows the N columns (8 for up to 8 rows, else 16: no softmax work on 16 padded rows), Q^T a loop-invariant
  B operand. The channels (the reduction axis) are permuted, the same way for Q and K (:func:`_k_order`), so that a
  thread's K registers are 16 (D = 128) or 8 (D = 64) consecutive code bytes of each of its 8 keys.
- The softmax and fq(P) run on S^T's accumulators; a thread's 8 keys are half an fq(P) block (one shuffle for the
  block maximum). One ``movmatrix.trans`` per 8 x 8 block turns them into the B operand of ``O^T = V^T P^T``, whose
  accumulators hold the same query rows per thread as S^T's (alpha needs no exchange).
- With at most 4 query rows (8 columns, half of them padding), the two halves of the tile's keys share the columns
  (:func:`_scores_packed`): the first 32 rows of K times Q^T in columns 0-3 and the last 32 times Q^T in columns 4-7
  give S^T as ``[32, 8]``, the softmax and fq(P) run on it as ``[64 keys, 4 rows]`` with no padding, and each query
  row's O is summed over the halves in two column groups of O^T (:func:`_pv_packed`), added at the end: the same
  products, half the softmax work.
- V^T is the A operand: its register pairs are two keys of one channel, so one byte permute per two code words
  interleaves the two keys' bytes before the conversion; a thread reads 8 (4) consecutive code bytes of 16 keys.
- A code byte becomes two FP16 values by bit operations to E4M3 bytes (``E2M1 * 2**-6``, as the Triton kernel's
  E4M3-conversion path reads them), one ``cvt.rn.f16x2.e4m3x2`` per two values and one FP16 multiply by the block
  scale per two values (exact: at most 6 significant bits); the factor 2**6 goes into the softmax scale and the final
  normalization, as in the Triton kernel.

Every relabelling of indices between those layouts is a reshape and permute of the tensors (so the values computed do
not depend on the layouts), and every layout conversion inside the KV loop is asserted free when the kernel is
traced; only the inline assembly (the dequantization, ``movmatrix``) relies on its register packing, two or eight
consecutive elements a call, which its docstring states.

Rounding is the Triton kernel's wherever it is defined (fq(Q) by ``fq_tile``, fq(P) by ``fq_probs`` on the same
keys, the same FP32 softmax expressions, the same ``m``/``l`` partials); the summation order inside the products and
of ``l`` differs (FP32 sums in another order, as any two matmul schedules differ).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from jqat.kernels_triton import decode as kdec
from jqat.kernels_triton.attention_common import LOG2_P_ROW_RANGE, LOG2E
from jqat.kernels_triton.nvfp4 import fq_probs, fq_tile

BLOCK_N = 64  # keys per tile: the only tile the layouts below are written for
HEAD_DIMS = (64, 128)
MAX_ROWS = 16
# Two KV heads a program: at 192 registers a thread (S^T packed) a four-warp program leaves two per SM and a two-warp
# one five; two were 0.6-7% faster than four at every timed shape (docs/BENCHMARKS.md, decode_gluon.py --sweep).
MAX_KV_GROUP = 2
# Set for measurements (benchmarks/decode_gluon.py): KV tiles in shared memory (None: stages()); KV heads a program
# takes (None: kv_group()); PROBE 1 runs the copies alone, 2 the compute alone (0: the kernel); PACK False: S^T never
# packed (packs()); MAXNREG a cap on registers per thread (0: none).
STAGES = None
KV_GROUP = None
PROBE = 0
PACK = True
# No cap by default: the caps that fit more programs on an SM (168 a thread for one new token; 200 and 168 for four,
# and 232) were slower at every timed shape, with or without spills, and 128 at D = 64 level (docs/BENCHMARKS.md,
# decode_gluon.py --caps).
MAXNREG = 0


def kv_group(kv_heads: int) -> int:
  """KV heads a program takes, one warp each: the largest power of two up to MAX_KV_GROUP dividing ``kv_heads``."""
  g = KV_GROUP or MAX_KV_GROUP
  while kv_heads % g:
    g //= 2
  return g


def stages(head_dim: int, rows: int, kv_group: int) -> int:
  """KV tiles a program keeps in shared memory: 3 (two tiles' copies in flight) for one KV head at D = 128 with up to
  8 rows, else 2 (groups of KV heads fit more programs per SM with two); the faster at each shape of
  benchmarks/decode_gluon.py (docs/BENCHMARKS.md)."""
  if STAGES is not None:
    return STAGES
  return 3 if kv_group == 1 and head_dim == 128 and rows <= 8 else 2


def supported(head_dim: int, rows: int, block_n: int, page_size: int, quantize_q: bool, quantize_p: bool,
              hw_e4m3: bool) -> bool:
  """Whether :func:`decode_split_kernel` takes this launch (else the Triton kernel does)."""
  return (head_dim in HEAD_DIMS and 0 < rows <= MAX_ROWS and block_n == BLOCK_N and page_size % BLOCK_N == 0
          and bool(quantize_q) and bool(quantize_p) and bool(hw_e4m3))


def packs(rows: int) -> bool:
  """Whether a launch of ``rows`` query rows per KV head packs S^T (:func:`decode_split_kernel`'s PACK): at most half
  of :func:`block_rows`, so that half of S^T's columns would be padding (unless :data:`PACK` is False)."""
  return PACK and rows <= block_rows(rows) // 2


def block_rows(rows: int) -> int:
  """Query rows of a program: 8 (up to 8 rows) or 16."""
  return 8 if rows <= 8 else 16


# ----------------------------------------------------------------------------- layouts
#
# Linear layouts (https://arxiv.org/abs/2505.23819): each basis is the index step of one register bit or lane bit of
# a thread. One warp; lane = 4 g + t as in the m16n8k16 fragments. nw = D / 8 code words (4 bytes) a key, nb = D / 16
# blocks (two words each).


@gluon.constexpr_function
def _warp_bases(kg, rank):
  """One warp per index of a leading axis of size ``kg``."""
  return [[1 << i] + [0] * rank for i in range(int(kg).bit_length() - 1)]


@gluon.constexpr_function
def _lin(reg, lane, shape, kg):
  """The linear layout of ``[kg] + shape``: warp ``w`` holds index ``w`` of the leading axis, and within it each
  register and lane bit steps the trailing indices by ``reg`` and ``lane``."""
  pad = lambda b: [0] + list(b)
  return gl.DistributedLinearLayout(reg_bases=[pad(b) for b in reg], lane_bases=[pad(b) for b in lane],
                                    warp_bases=_warp_bases(kg, len(shape)), block_bases=[],
                                    shape=[int(kg)] + list(shape))


@gluon.constexpr_function
def mma_layout(kg):
  return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[int(kg), 1, 1], instr_shape=[1, 16, 8])


@gluon.constexpr_function
def k_words_layout(head_dim, pairs, kg):
  """K code words, ``[64 keys, nw]`` (``pairs``: ``[64, nb, 2]``, word = 2 pair + word in pair): thread ``(g, t)``
  holds the ``nw / 4`` words from ``t * nw / 4`` of keys ``8 g + 2 mt + h`` (mt < 4, h < 2): the A operand of
  ``S^T = K Q^T``, whose rows ``m = g + 8 h + 16 mt`` are those keys (:func:`_key_rows`)."""
  if head_dim == 128:
    reg, lane = [(0, 1), (0, 2), (1, 0), (2, 0), (4, 0)], [(0, 4), (0, 8), (8, 0), (16, 0), (32, 0)]
  else:
    reg, lane = [(0, 1), (1, 0), (2, 0), (4, 0)], [(0, 2), (0, 4), (8, 0), (16, 0), (32, 0)]
  if pairs:
    split = lambda b: (b[0], b[1] // 2, b[1] % 2)
    return _lin([split(b) for b in reg], [split(b) for b in lane], (64, head_dim // 16, 2), kg)
  return _lin(reg, lane, (64, head_dim // 8), kg)


@gluon.constexpr_function
def k_scales_layout(head_dim, kg):
  """K scales ``[64 keys, nb]`` as :func:`k_words_layout` needs them: the blocks of the thread's words."""
  if head_dim == 128:
    reg, lane = [(0, 1), (1, 0), (2, 0), (4, 0)], [(0, 2), (0, 4), (8, 0), (16, 0), (32, 0)]
  else:
    reg, lane = [(1, 0), (2, 0), (4, 0)], [(0, 1), (0, 2), (8, 0), (16, 0), (32, 0)]
  return _lin(reg, lane, (64, head_dim // 16), kg)


@gluon.constexpr_function
def v_words_layout(head_dim, kg):
  """V code words as read, ``[64 keys, nw]``: thread ``(g, t)`` holds the words of block g (D = 128) or word g
  (D = 64) of keys ``16 t + 8 e + 2 c + h`` (the A operand of ``O^T = V^T P^T``; its column ``k = e + 2 t + 8 h +
  16 c`` is row ``k`` of ``S^T``, key ``kappa(k)``)."""
  if head_dim == 128:
    reg, lane = [(0, 1), (8, 0), (1, 0), (2, 0), (4, 0)], [(16, 0), (32, 0), (0, 2), (0, 4), (0, 8)]
  else:
    reg, lane = [(8, 0), (1, 0), (2, 0), (4, 0)], [(16, 0), (32, 0), (0, 1), (0, 2), (0, 4)]
  return _lin(reg, lane, (64, head_dim // 8), kg)


@gluon.constexpr_function
def v_scales_layout(head_dim, kg):
  """V scales ``[64 keys, nb]`` as :func:`v_words_layout` needs them (D = 64: two lanes share a block)."""
  if head_dim == 128:
    lane = [(16, 0), (32, 0), (0, 1), (0, 2), (0, 4)]
  else:
    lane = [(16, 0), (32, 0), (0, 0), (0, 1), (0, 2)]
  return _lin([(8, 0), (1, 0), (2, 0), (4, 0)], lane, (64, head_dim // 16), kg)


@gluon.constexpr_function
def v_pairs_layout(head_dim, blocks, kg):
  """:func:`v_words_layout` as ``[32 key pairs, nw, 2]``: pair ``p = h + 2 c + 8 t`` holds keys ``16 t + 2 c + h``
  and that key plus 8 (the two columns ``k, k + 1`` of a register of the A operand), the key in pair first in
  registers, as :func:`_dequant_pairs` reads them; ``blocks``: as ``[32, nb, 2, 2]`` (pair, block, word in block,
  key in pair), for the scales' broadcast."""
  if head_dim == 128:
    reg, lane = [(0, 0, 1), (0, 1, 0), (1, 0, 0), (2, 0, 0), (4, 0, 0)], [(8, 0, 0), (16, 0, 0), (0, 2, 0), (0, 4, 0),
                                                                           (0, 8, 0)]
  else:
    reg, lane = [(0, 0, 1), (1, 0, 0), (2, 0, 0), (4, 0, 0)], [(8, 0, 0), (16, 0, 0), (0, 1, 0), (0, 2, 0), (0, 4, 0)]
  if blocks:
    split = lambda b: (b[0], b[1] // 2, b[1] % 2, b[2])
    return _lin([split(b) for b in reg], [split(b) for b in lane], (32, head_dim // 16, 2, 2), kg)
  return _lin(reg, lane, (32, head_dim // 8, 2), kg)


@gluon.constexpr_function
def codes_smem_layout(head_dim, kg):
  """A tile of code words in shared memory, ``[64 keys, nw]``, so that neither operand's reads conflict: K's fragments
  read 16 (8) bytes of keys ``x + 8 g`` for g < 2 (g < 4) per 8 (16) lanes, V^T's read 8 (4) bytes of keys ``x + 16 t``
  (t < 4) per 16 (32) lanes. The physical row's bit 0 is ``n3 ^ n4`` and the 32-byte halves of a row swap where
  ``n5`` is set (D = 128: two rows of a 128-byte bank cycle); for D = 64 (four rows a cycle) its bits 0, 1 are
  ``n3 ^ n5, n4``: the four 32-byte bank windows of each access are distinct. Bases: the logical ``(head, key,
  word)`` of each bit of the word offset; each KV head of the group ``[kg, 64 keys, nw]`` has its own tile above."""
  if head_dim == 128:
    bases = [[0, 1], [0, 2], [0, 4], [0, 8], [8, 0], [1, 0], [2, 0], [4, 0], [24, 0], [32, 8]]
  else:
    bases = [[0, 1], [0, 2], [0, 4], [8, 0], [16, 0], [1, 0], [2, 0], [4, 0], [40, 0]]
  return gl.SharedLinearLayout(offset_bases=[[0] + b for b in bases] + _warp_bases(kg, 2))


@gluon.constexpr_function
def scales_smem_layout(head_dim, kg):
  """A tile of scale bytes in shared memory, ``[kg, 64 keys, nb]``, keys' bits 3..5 lowest: the eight keys ``x + 8 g``
  that K's reads touch together are adjacent rows; each KV head's tile above the previous one."""
  byte = [[0, 1], [0, 2], [0, 4]][:(head_dim // 16).bit_length() - 1]
  bases = byte + [[8, 0], [16, 0], [32, 0], [1, 0], [2, 0], [4, 0]]
  return gl.SharedLinearLayout(offset_bases=[[0] + b for b in bases] + _warp_bases(kg, 2))


@gluon.constexpr_function
def copy_layout(width, vec, kg):
  """The global side of a tile's copy into shared memory: ``[kg heads, 64 keys, width]`` elements, ``vec``
  consecutive a thread; the lanes of one copy instruction run along a cache row (the group's heads of a key, whose
  bytes are contiguous in the cache) and the warps along the keys."""
  lanes = min(32, width // vec)
  heads = min(32 // lanes, int(kg))
  return gl.BlockedLayout([1, 1, vec], [heads, 32 // lanes // heads, lanes], [1, int(kg), 1], [2, 0, 1])


@gluon.constexpr_function
def q_layout(kg):
  """Q ``[kg, rows, D]`` as loaded: 16 bytes a thread along D, one warp per KV head."""
  return gl.BlockedLayout([1, 1, 8], [1, 2, 16], [int(kg), 1, 1], [2, 1, 0])


# ----------------------------------------------------------------------------- device functions


def _nibbles_asm(select: int, low: tuple, high: tuple) -> str:
  """PTX of one byte permute of :func:`_dequant_pairs` (``prmt`` selector ``select``) and the four conversions of
  its low and high nibbles into output registers ``low`` and ``high``."""
  return (f"prmt.b32 p, $8, $9, {select:#x};\n"
          "shl.b32 t, p, 4; and.b32 t, t, 0x80808080; shl.b32 l, p, 2; and.b32 l, l, 0x1C1C1C1C; or.b32 l, l, t;\n"
          "shr.u32 h, p, 2; and.b32 h, h, 0x1C1C1C1C; and.b32 t, p, 0x80808080; or.b32 h, h, t;\n"
          "mov.b32 {l0, l1}, l; mov.b32 {h0, h1}, h;\n"
          f"cvt.rn.f16x2.e4m3x2 ${low[0]}, l0; cvt.rn.f16x2.e4m3x2 ${low[1]}, l1;\n"
          f"cvt.rn.f16x2.e4m3x2 ${high[0]}, h0; cvt.rn.f16x2.e4m3x2 ${high[1]}, h1;\n")


# Bytes 0, 1 of both words into outputs 0, 1 (low nibbles) and 4, 5 (high), bytes 2, 3 into 2, 3 and 6, 7; then the
# scale multiply of all eight.
_DEQUANT_PAIRS_ASM = gl.constexpr(
    "{\n.reg .b32 p, l, h, t;\n.reg .b16 l0, l1, h0, h1;\n" + _nibbles_asm(0x5140, (0, 1), (4, 5))
    + _nibbles_asm(0x7362, (2, 3), (6, 7)) + "".join(f"mul.rn.f16x2 ${i}, ${i}, $10;\n" for i in range(8)) + "}")


@gluon.jit
def _dequant_pairs(words, scales):
  """Dequantized values of int32 code ``words`` (4 code bytes each, element ``2i`` of a byte in its low nibble) times
  FP16 ``scales``, elementwise, for two elements at a time (consecutive in registers: the same word of two keys, or
  two words of one key): returns 8 FP16 tensors shaped like ``words``, the low nibbles of bytes 0..3 and then the
  high ones, each ``E2M1 * 2**-6 * scale`` (exact).

  One byte permute per word interleaves the two elements' bytes, so that each E4M3 byte pair that one
  ``cvt.rn.f16x2.e4m3x2`` converts is the same nibble of both elements: each output register is the pair of
  elements, as the tensor cores take it. A nibble ``s e e m`` becomes the E4M3 byte ``s 0 0 e e m 0 0``
  (``E2M1 * 2**-6``; exponent 0 is the subnormal 0.5 * 2**-6), as in the Triton kernel's E4M3-conversion path."""
  return gl.inline_asm_elementwise(
      asm=_DEQUANT_PAIRS_ASM,
      constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", args=[words, scales], dtype=(gl.float16, ) * 8, is_pure=True,
      pack=2)


@gluon.jit
def _values(outs):
  """The 8 tensors of :func:`_dequant_pairs` as one, ``[..., 2 (byte bit 0), 2 (byte bit 1), 2 (nibble)]``: channel
  ``2 (4 word + byte) + nibble``."""
  o0, o1, o2, o3, o4, o5, o6, o7 = outs
  lo = gl.join(gl.join(o0, o1), gl.join(o2, o3))
  hi = gl.join(gl.join(o4, o5), gl.join(o6, o7))
  return gl.join(lo, hi)


# Every tensor below leads with the group's KV head (one warp each): the index relabellings act on the axes after it.


@gluon.jit
def _k_order(x, HEAD_DIM: gl.constexpr):
  """``x [G, R, nb, 2 (word in pair), 2 (byte bit 0), 2 (byte bit 1), 2 (nibble)]`` as ``[G, R, D]`` in the order of
  the reduction axis of ``S = Q K^T``, for K (:func:`k_words_layout`) and Q alike: k = wp + 2 pb1 + 4 pb2 + 8 bb0 + 16
  bb1 + 32 pb0 + 64 nib for D = 128 (pb: the word pair's bits), k = wp + 2 pb0 + 4 pb1 + 8 bb0 + 16 bb1 + 32 nib for
  D = 64, so that the register pairs of the operand are the two words of a pair and the thread bits of the fragment
  are the pair's upper bits."""
  g: gl.constexpr = x.shape[0]
  r: gl.constexpr = x.shape[1]
  if HEAD_DIM == 128:
    x = gl.reshape(x, [g, r, 2, 2, 2, 2, 2, 2, 2])  # pb2, pb1, pb0, wp, bb0, bb1, nib
    x = gl.permute(x, [0, 1, 8, 4, 7, 6, 2, 3, 5])  # nib, pb0, bb1, bb0, pb2, pb1, wp
  else:
    x = gl.reshape(x, [g, r, 2, 2, 2, 2, 2, 2])  # pb1, pb0, wp, bb0, bb1, nib
    x = gl.permute(x, [0, 1, 7, 6, 5, 2, 3, 4])  # nib, bb1, bb0, pb1, pb0, wp
  return gl.reshape(x, [g, r, HEAD_DIM])


@gluon.jit
def _q_order(q, HEAD_DIM: gl.constexpr):
  """Q ``[G, R, D]`` (channel order) in :func:`_k_order`'s order: channel = 16 pair + 8 wp + 4 bb1 + 2 bb0 + nib."""
  g: gl.constexpr = q.shape[0]
  r: gl.constexpr = q.shape[1]
  q = gl.reshape(q, [g, r, HEAD_DIM // 16, 2, 2, 2, 2])  # pair, wp, bb1, bb0, nib
  return _k_order(gl.permute(q, [0, 1, 2, 3, 5, 4, 6]), HEAD_DIM)


@gluon.jit
def _key_rows(x, TO_ROWS: gl.constexpr):
  """``x [G, 64 keys, C]`` as ``[G, 64 rows m, C]`` (TO_ROWS), or back: row ``m = g + 8 h + 16 mt`` of ``S^T`` is key
  ``kappa(m) = 8 g + 2 mt + h`` (:func:`k_words_layout`)."""
  g: gl.constexpr = x.shape[0]
  c: gl.constexpr = x.shape[2]
  if TO_ROWS:
    x = gl.permute(gl.reshape(x, [g, 8, 4, 2, c]), [0, 2, 3, 1, 4])  # (g, mt, h) -> (mt, h, g)
  else:
    x = gl.permute(gl.reshape(x, [g, 4, 2, 8, c]), [0, 3, 1, 2, 4])  # (mt, h, g) -> (g, mt, h)
  return gl.reshape(x, [g, 64, c])


@gluon.jit
def _v_pairs(x):
  """``x [G, 64 keys, C]`` as ``[G, 32 pairs, C, 2]``: pair ``h + 2 c + 8 t`` of keys ``16 t + 8 e + 2 c + h``,
  e < 2."""
  g: gl.constexpr = x.shape[0]
  c: gl.constexpr = x.shape[2]
  x = gl.reshape(x, [g, 4, 2, 8, c])  # t, e, (c, h)
  x = gl.permute(x, [0, 1, 3, 4, 2])
  return gl.reshape(x, [g, 32, c, 2])


@gluon.jit
def _v_transposed(x, HEAD_DIM: gl.constexpr):
  """Dequantized V ``[G, 32 pairs, nw, 2 (e), 2, 2, 2]`` (:func:`_values`) as ``V^T [G, m, k]``: column ``k = e + 2 t
  + 8 h + 16 c`` (key ``16 t + 8 e + 2 c + h``, row k of ``S^T``); row m = wg + 8 nib + 16 bb0 + 32 bb1 + 64 w1 for
  D = 128 (word = 2 wg + w1), m = w + 8 nib + 16 bb0 + 32 bb1 for D = 64."""
  g: gl.constexpr = x.shape[0]
  if HEAD_DIM == 128:
    x = gl.reshape(x, [g, 4, 4, 2, 8, 2, 2, 2, 2, 2])  # t, c, h, wg, w1, e, bb0, bb1, nib
    x = gl.permute(x, [0, 5, 8, 7, 9, 4, 2, 3, 1, 6])  # w1, bb1, bb0, nib, wg | c, h, t, e
  else:
    x = gl.reshape(x, [g, 4, 4, 2, 8, 2, 2, 2, 2])  # t, c, h, w, e, bb0, bb1, nib
    x = gl.permute(x, [0, 7, 6, 8, 4, 2, 3, 1, 5])  # bb1, bb0, nib, w | c, h, t, e
  return gl.reshape(x, [g, HEAD_DIM, 64])


@gluon.jit
def _transpose8(p):
  """``p [G, M, R]`` FP16 in the accumulator layout of ``S^T`` as the B operand of ``O^T = V^T P^T`` (the same
  tensor): one ``movmatrix.trans`` per 8 x 8 block moves each thread's pair of rows of a key to its pair of keys of a
  row. The instruction's result, read in the input's layout, is p with the low three bits of the row and column
  indices swapped; the reshape and permute below undo that on the indices, so the value returned is p itself."""
  g: gl.constexpr = p.shape[0]
  m: gl.constexpr = p.shape[1]
  r: gl.constexpr = p.shape[2]
  y = gl.inline_asm_elementwise(asm="movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", constraints="=r,r", args=[p],
                                dtype=gl.float16, is_pure=False, pack=2)
  y = gl.reshape(y, [g, m // 8, 8, r // 8, 8])  # m_hi, m_lo, n_hi, n_lo
  y = gl.permute(y, [0, 1, 4, 3, 2])
  return gl.reshape(y, [g, m, r])


@gluon.jit
def _o_channels(acc, HEAD_DIM: gl.constexpr):
  """``O^T [G, m, R]`` (m as in :func:`_v_transposed`) as ``O [G, R, D]`` in channel order (2 (4 word + byte) +
  nib)."""
  g: gl.constexpr = acc.shape[0]
  r: gl.constexpr = acc.shape[2]
  if HEAD_DIM == 128:
    x = gl.reshape(acc, [g, 2, 2, 2, 2, 8, r])  # w1, bb1, bb0, nib, wg, row
    x = gl.permute(x, [0, 6, 5, 1, 2, 3, 4])  # row, wg, w1, bb1, bb0, nib
  else:
    x = gl.reshape(acc, [g, 2, 2, 2, 8, r])  # bb1, bb0, nib, w, row
    x = gl.permute(x, [0, 5, 4, 1, 2, 3])  # row, w, bb1, bb0, nib
  return gl.reshape(x, [g, r, HEAD_DIM])


@gluon.jit
def _index3(N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, layout: gl.constexpr):
  """The indices along each axis of an ``[N0, N1, N2]`` tensor in ``layout``: ``[N0, 1, 1]``, ``[1, N1, 1]`` and
  ``[1, 1, N2]``, broadcastable against it."""
  i0 = gl.arange(0, N0, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))[:, None, None]
  i1 = gl.arange(0, N1, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))[None, :, None]
  i2 = gl.arange(0, N2, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))[None, None, :]
  return i0, i1, i2


@gluon.jit
def _halves(x):
  """``x [G, M, C]`` as its two halves along the middle axis, ``x[:, :M / 2]`` and ``x[:, M / 2:]``."""
  g: gl.constexpr = x.shape[0]
  m: gl.constexpr = x.shape[1]
  c: gl.constexpr = x.shape[2]
  return gl.split(gl.permute(gl.reshape(x, [g, 2, m // 2, c]), [0, 2, 3, 1]))


@gluon.jit
def _halves_last(x):
  """``x [G, C, M]`` as its two halves along the last axis."""
  g: gl.constexpr = x.shape[0]
  c: gl.constexpr = x.shape[1]
  m: gl.constexpr = x.shape[2]
  return gl.split(gl.permute(gl.reshape(x, [g, c, 2, m // 2]), [0, 1, 3, 2]))


@gluon.jit
def _unpack(x):
  """A packed ``x [G, M, 2 Q]`` (column ``Q h + q``: row ``M h + m`` of query ``q``) as ``[G, 2 M, Q]``."""
  g: gl.constexpr = x.shape[0]
  m: gl.constexpr = x.shape[1]
  q: gl.constexpr = x.shape[2] // 2
  return gl.reshape(gl.permute(gl.reshape(x, [g, m, 2, q]), [0, 2, 1, 3]), [g, 2 * m, q])


@gluon.jit
def _pack(x):
  """The inverse of :func:`_unpack`: ``[G, 2 M, Q]`` as ``[G, M, 2 Q]``."""
  g: gl.constexpr = x.shape[0]
  m: gl.constexpr = x.shape[1] // 2
  q: gl.constexpr = x.shape[2]
  return gl.reshape(gl.permute(gl.reshape(x, [g, 2, m, q]), [0, 2, 1, 3]), [g, m, 2 * q])


@gluon.jit
def _e4m3_to_f16(b):
  """E4M3 bytes (uint8) as FP16 values (exact; NaN stays NaN)."""
  return b.to(gl.float8e4nv, bitcast=True).to(gl.float16)


@gluon.jit
def _page(b, tile, t_hi, pt_ptr, pages_per_seq, num_pages, PAGE_SIZE: gl.constexpr):
  """Where KV tile ``tile`` of sequence ``b`` lies (int64, for ``decode.row_offset``): its page id
  (``decode.page_ids``, as the Triton kernel reads it; 0 for a tile at or past ``t_hi``: not read); in a contiguous
  cache, the sequence ``b`` itself. The walk
  reads each id one tile ahead of its copies, so that the table's latency is not on the path of the copies' issue."""
  if PAGE_SIZE > 0:
    return kdec.page_ids(pt_ptr, b, pages_per_seq, num_pages, tile * 64 // PAGE_SIZE, tile < t_hi)
  else:
    return b.to(gl.int64)


@gluon.jit
def _copy(dst, ptr, at, key, n_valid):
  """Starts the copy of one tile's array into shared memory ``dst``; keys ``>= n_valid`` are zero-filled."""
  if n_valid >= 64:
    async_copy.async_copy_global_to_shared(dst, ptr + at)
  else:
    async_copy.async_copy_global_to_shared(dst, ptr + at, mask=key < n_valid)


@gluon.jit
def _issue_tile(kc_s, ks_s, vc_s, vs_s, kc_ptr, ks_ptr, vc_ptr, vs_ptr, kc_at, ks_at, vc_at, vs_at, kc_key, ks_key,
                page, kvh0, tile, t_hi, kv_len, stride_kcp, stride_kck, stride_ksp, stride_ksk, stride_vcp, stride_vck,
                stride_vsp, stride_vsk, KC_T: gl.constexpr, KS_T: gl.constexpr, VC_T: gl.constexpr,
                VS_T: gl.constexpr, PAGE_SIZE: gl.constexpr):
  """Starts the copies of KV tile ``tile`` (in ``page``: :func:`_page`) of the group's KV heads (from ``kvh0``;
  nothing past ``t_hi``: zero-filled) and commits them as one group."""
  # Key 0 of the tile: the Triton kernel's row offsets (a tile lies in one page, PAGE_SIZE % 64 == 0).
  kn = tile * 64
  n_valid = gl.where(tile < t_hi, gl.minimum(kv_len - kn, 64), 0)
  _copy(kc_s, kc_ptr + kdec.row_offset(page, kn, kvh0, stride_kcp, KC_T, stride_kck, PAGE_SIZE) // 4, kc_at, kc_key,
        n_valid)
  _copy(ks_s, ks_ptr + kdec.row_offset(page, kn, kvh0, stride_ksp, KS_T, stride_ksk, PAGE_SIZE), ks_at, ks_key,
        n_valid)
  _copy(vc_s, vc_ptr + kdec.row_offset(page, kn, kvh0, stride_vcp, VC_T, stride_vck, PAGE_SIZE) // 4, vc_at, kc_key,
        n_valid)
  _copy(vs_s, vs_ptr + kdec.row_offset(page, kn, kvh0, stride_vsp, VS_T, stride_vsk, PAGE_SIZE), vs_at, ks_key,
        n_valid)
  async_copy.commit_group()


@gluon.jit
def _copy_offsets(layout: gl.constexpr, G: gl.constexpr, WIDTH: gl.constexpr, head_stride, key_stride):
  """Loop-invariant offsets (int64 elements) of each thread's part of a tile's copy, ``[G, 64, WIDTH]`` in ``layout``
  (int64: a sum in int32 would be sign-extended element by element), and the key of each, ``[1, 64, 1]``."""
  head, key, col = _index3(G, 64, WIDTH, layout)
  return head.to(gl.int64) * head_stride + key.to(gl.int64) * key_stride + col.to(gl.int64), key


@gluon.jit
def _k_operand(kc_s, ks_s, HEAD_DIM: gl.constexpr, G: gl.constexpr):
  """K of each KV head's tile in shared memory ``kc_s``/``ks_s``, dequantized, ``[G, 64 rows, D]``: row m is key
  ``kappa(m)``, the channels in :func:`_k_order`'s order."""
  NB: gl.constexpr = HEAD_DIM // 16
  KW3: gl.constexpr = k_words_layout(HEAD_DIM, True, G)
  kw = gl.convert_layout(gl.reshape(kc_s.load(k_words_layout(HEAD_DIM, False, G)), [G, 64, NB, 2]), KW3,
                         assert_trivial=True)
  ksc = gl.convert_layout(_e4m3_to_f16(ks_s.load(k_scales_layout(HEAD_DIM, G))), gl.SliceLayout(3, KW3),
                          assert_trivial=True)
  ksc = gl.broadcast(gl.expand_dims(ksc, 3), gl.full([G, 64, NB, 2], 0, gl.float16, layout=KW3))[0]
  return _key_rows(_k_order(_values(_dequant_pairs(kw, ksc)), HEAD_DIM), True)


@gluon.jit
def _scores(kc_s, ks_s, qt, HEAD_DIM: gl.constexpr, G: gl.constexpr, R: gl.constexpr):
  """``S^T = K Q^T`` of each KV head's tile in shared memory ``kc_s``/``ks_s`` (FP32 ``[G, 64, R]``; row m is key
  ``kappa(m)``): K dequantized into the A operand, Q^T the B operand."""
  MMA: gl.constexpr = mma_layout(G)
  kk = gl.convert_layout(_k_operand(kc_s, ks_s, HEAD_DIM, G), gl.DotOperandLayout(0, MMA, 2), assert_trivial=True)
  return mma_v2(kk, qt, gl.zeros([G, 64, R], gl.float32, layout=MMA))


@gluon.jit
def _scores_packed(kc_s, ks_s, qt_lo, qt_hi, HEAD_DIM: gl.constexpr, G: gl.constexpr, R: gl.constexpr):
  """:func:`_scores` for at most R / 2 query rows, as ``[G, 64, R / 2]``: the first 32 rows of K times ``qt_lo``
  (Q^T in columns ``< R / 2``, zero beyond) and the last 32 times ``qt_hi`` (Q^T in the columns from R / 2) fill the
  columns of one ``[32, R]`` accumulator, so that the softmax has no padding column; the same products. Two
  accumulators and a select, not one accumulator, so that a NaN key of one half never reaches the other's scores."""
  MMA: gl.constexpr = mma_layout(G)
  A_OP: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
  k_lo, k_hi = _halves(_k_operand(kc_s, ks_s, HEAD_DIM, G))
  zero = gl.zeros([G, 32, R], gl.float32, layout=MMA)
  s_lo = mma_v2(gl.convert_layout(k_lo, A_OP, assert_trivial=True), qt_lo, zero)
  s_hi = mma_v2(gl.convert_layout(k_hi, A_OP, assert_trivial=True), qt_hi, zero)
  n = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))[None, None, :]
  return _unpack(gl.where(n < R // 2, s_lo, s_hi))


@gluon.jit
def _probs(s, tile, kappa, limit, m, qk_scale, G: gl.constexpr, R: gl.constexpr, P_ROW_RANGE: gl.constexpr,
           HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr):
  """The tile's softmax step and fq(P), as the Triton kernel computes them, on ``S^T [G, 64, R]`` (keys along axis
  1, R query rows): returns the new running max, the rescale ``alpha`` of the old state, the probabilities (FP32,
  for l) and fq(P) (FP16, exact), in S^T's layout."""
  s = s * qk_scale
  kn = tile * 64 + kappa
  s = gl.where(kn[None, :, None] < limit[:, None, :], s, float("-inf"))
  m_new = gl.maximum(m, gl.max(s, axis=1))
  m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
  if P_ROW_RANGE > 0:
    gl.static_assert(P_ROW_RANGE == 6.0 * 448.0, "LOG2_P_ROW_RANGE is log2(6 * 448)")
    p = gl.exp2(s - (m_safe - LOG2_P_ROW_RANGE)[:, None, :])
  else:
    p = gl.exp2(s - m_safe[:, None, :])
  alpha = gl.exp2(m - m_safe)
  pq = gl.reshape(gl.permute(_key_rows(p, False), [0, 2, 1]), [G * R, 64])  # fq_probs' blocks of 16 keys
  pq = fq_probs(pq, G * R, 64, HW_E4M3, HW_E2M1).to(gl.float16)  # exact
  pq = _key_rows(gl.permute(gl.reshape(pq, [G, R, 64]), [0, 2, 1]), True)
  return m_new, alpha, p, gl.convert_layout(pq, s.type.layout, assert_trivial=True)


@gluon.jit
def _v_operand(vc_s, vs_s, HEAD_DIM: gl.constexpr, G: gl.constexpr):
  """V^T of each KV head's tile in shared memory ``vc_s``/``vs_s``, dequantized, ``[G, D rows, 64]``
  (:func:`_v_transposed`)."""
  NB: gl.constexpr = HEAD_DIM // 16
  NW: gl.constexpr = HEAD_DIM // 8
  VP4: gl.constexpr = v_pairs_layout(HEAD_DIM, True, G)
  vw = gl.convert_layout(_v_pairs(vc_s.load(v_words_layout(HEAD_DIM, G))), v_pairs_layout(HEAD_DIM, False, G),
                         assert_trivial=True)
  vsc = _v_pairs(_e4m3_to_f16(vs_s.load(v_scales_layout(HEAD_DIM, G))))
  vsc = gl.convert_layout(vsc, gl.SliceLayout(3, VP4), assert_trivial=True)
  vsc = gl.broadcast(gl.expand_dims(vsc, 3), gl.full([G, 32, NB, 2, 2], 0, gl.float16, layout=VP4))[0]
  vsc = gl.reshape(vsc, [G, 32, NW, 2])
  return _v_transposed(_values(_dequant_pairs(vw, vsc)), HEAD_DIM)


@gluon.jit
def _pv(vc_s, vs_s, pq, acc, alpha, HEAD_DIM: gl.constexpr, G: gl.constexpr):
  """``acc * alpha + V^T P^T`` for each KV head's tile in shared memory ``vc_s``/``vs_s`` and fq(P) ``pq`` (from
  :func:`_probs`): V^T dequantized into the A operand."""
  MMA: gl.constexpr = mma_layout(G)
  vt = gl.convert_layout(_v_operand(vc_s, vs_s, HEAD_DIM, G), gl.DotOperandLayout(0, MMA, 2), assert_trivial=True)
  pt = gl.convert_layout(_transpose8(pq), gl.DotOperandLayout(1, MMA, 2), assert_trivial=True)
  return mma_v2(vt, pt, acc * alpha[:, None, :])


@gluon.jit
def _pv_packed(vc_s, vs_s, pq, acc, alpha, HEAD_DIM: gl.constexpr, G: gl.constexpr, R: gl.constexpr):
  """:func:`_pv` for :func:`_scores_packed`'s ``pq [G, 64, R / 2]`` and a packed ``acc [G, D, R]`` (column ``R / 2
  h + q``: query q's sum over the keys of rows ``32 h ..`` of S^T): fq(P) packed back into ``[G, 32, R]`` and made
  the B operand, then V^T's first 32 columns times that operand with its columns from R / 2 zeroed and its last 32
  times it with the others zeroed. A NaN value reaches the other half's columns of the rows (``0 * NaN``), rows of
  the same tile, as a masked pair's does in :func:`_pv`."""
  MMA: gl.constexpr = mma_layout(G)
  A_OP: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
  B_OP: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
  pt = gl.convert_layout(_transpose8(gl.convert_layout(_pack(pq), MMA, assert_trivial=True)), B_OP,
                         assert_trivial=True)
  n = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(1, B_OP)))[None, None, :]
  pt_lo = gl.where(n < R // 2, pt, 0.0)
  pt_hi = gl.where(n < R // 2, 0.0, pt)
  v_lo, v_hi = _halves_last(_v_operand(vc_s, vs_s, HEAD_DIM, G))
  acc = _unpack(acc)  # [G, 2 D, R / 2]: both halves of a query row's sums rescale by its alpha
  acc = _pack(acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout), assert_trivial=True)[:, None, :])
  acc = mma_v2(gl.convert_layout(v_lo, A_OP, assert_trivial=True), pt_lo, gl.convert_layout(acc, MMA,
                                                                                           assert_trivial=True))
  return mma_v2(gl.convert_layout(v_hi, A_OP, assert_trivial=True), pt_hi, acc)


@gluon.jit
def decode_split_kernel(
    q_ptr, kc_ptr, ks_ptr, vc_ptr, vs_ptr, kv_len_ptr, pt_ptr,
    scale, tq, group, kv_heads, rows, row_blocks, capacity, pages_per_seq, num_pages,
    stride_qb, stride_qt, stride_qn, stride_ob, stride_ot, stride_on,
    stride_kcp, stride_kck, stride_ksp, stride_ksk, stride_vcp, stride_vck, stride_vsp, stride_vsk,
    o_ptr, part_acc_ptr, part_ml_ptr,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr,
    IS_CAUSAL: gl.constexpr, SPLITS: gl.constexpr, QUANTIZE_Q: gl.constexpr, QUANTIZE_P: gl.constexpr,
    P_ROW_RANGE: gl.constexpr, HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr, COMPILED: gl.constexpr,
    CODE_ALIGN: gl.constexpr, SCALE_ALIGN: gl.constexpr, KC_T: gl.constexpr, KS_T: gl.constexpr,
    VC_T: gl.constexpr, VS_T: gl.constexpr, STAGES: gl.constexpr, KV_GROUP: gl.constexpr, PROBE: gl.constexpr,
    PACK: gl.constexpr):
  """:func:`jqat.kernels_triton.decode.decode_split_kernel` (the same outputs) for the launches :func:`supported`
  takes, one program per (sequence, group of KV_GROUP KV heads, split) on KV_GROUP warps: grid ``(B * K / KV_GROUP,
  splits)``. Its arguments but the four caches' token strides, which come as the constants KC_T .. VS_T (immediate
  offsets of each thread's rows); ``row_blocks`` is 1 (BLOCK_M of 8 or 16 holds every row); STAGES: KV tiles in
  shared memory (the copies of the next STAGES - 1 in flight while one is computed); PROBE: :data:`PROBE`; PACK
  (at most BLOCK_M / 2 rows, :func:`packs`): S^T's columns hold the query rows twice, for the two halves of the
  tile's keys (:func:`_scores_packed`), so that the softmax and fq(P) do no work on padding columns."""
  gl.static_assert(HEAD_DIM == 64 or HEAD_DIM == 128, "D of 64 or 128")
  gl.static_assert(BLOCK_N == 64, "KV tiles of 64 keys")
  gl.static_assert(BLOCK_M == 8 or BLOCK_M == 16, "8 or 16 query rows a program")
  gl.static_assert(QUANTIZE_Q and QUANTIZE_P and HW_E4M3 and COMPILED, "quantized Q and P, compiled sm_89+ code")
  gl.static_assert(PAGE_SIZE % 64 == 0, "pages of a multiple of 64 rows")
  gl.static_assert(KC_T % 4 == 0 and VC_T % 4 == 0, "code rows of whole words")
  gl.static_assert(gl.num_warps() == KV_GROUP, "one warp per KV head of the group")
  G: gl.constexpr = KV_GROUP
  NB: gl.constexpr = HEAD_DIM // 16
  NW: gl.constexpr = HEAD_DIM // 8
  R: gl.constexpr = BLOCK_M
  QR: gl.constexpr = R // 2 if PACK else R  # the query rows of the softmax's tensors
  MMA: gl.constexpr = mma_layout(G)
  B_OP: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
  stride_qb, stride_qt, stride_qn = stride_qb // 16 * 16, stride_qt // 16 * 16, stride_qn // 16 * 16
  stride_ob, stride_ot, stride_on = stride_ob // 16 * 16, stride_ot // 16 * 16, stride_on // 16 * 16
  stride_kcp, stride_kck = stride_kcp // CODE_ALIGN * CODE_ALIGN, stride_kck // CODE_ALIGN * CODE_ALIGN
  stride_vcp, stride_vck = stride_vcp // CODE_ALIGN * CODE_ALIGN, stride_vck // CODE_ALIGN * CODE_ALIGN
  stride_ksp, stride_ksk = stride_ksp // SCALE_ALIGN * SCALE_ALIGN, stride_ksk // SCALE_ALIGN * SCALE_ALIGN
  stride_vsp, stride_vsk = stride_vsp // SCALE_ALIGN * SCALE_ALIGN, stride_vsk // SCALE_ALIGN * SCALE_ALIGN
  kw_ptr = kc_ptr.to(gl.pointer_type(gl.int32), bitcast=True)  # code words: 4 bytes, element 8i in word i's byte 0
  vw_ptr = vc_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
  ks_ptr = ks_ptr.to(gl.pointer_type(gl.uint8), bitcast=True)  # the E4M3 bit patterns
  vs_ptr = vs_ptr.to(gl.pointer_type(gl.uint8), bitcast=True)
  pid = gl.program_id(0)
  split = gl.program_id(1)
  groups = kv_heads // G
  kvh0 = (pid % groups) * G
  b = pid // groups

  # fq(Q), once, before the tiles' shared memory is allocated (its layout conversion borrows shared memory): in
  # channel order (the Triton kernel's fq_tile), then permuted to the products' reduction order and transposed: the
  # B operand of S^T = K Q^T.
  QL: gl.constexpr = q_layout(G)
  hq, rq, dq = _index3(G, R, HEAD_DIM, QL)
  rqq = rq % QR  # packed: the query row of both halves' columns
  q_ok = (hq < G) & (rqq < rows) & (dq < HEAD_DIM)
  q_rows = (b.to(gl.int64) * stride_qb + (rqq // group).to(gl.int64) * stride_qt
            + ((kvh0 + hq) * group + rqq % group).to(gl.int64) * stride_qn)
  q = gl.load(q_ptr + q_rows + dq, mask=q_ok, other=0.0)
  q = fq_tile(gl.reshape(q.to(gl.float32), [G * R, HEAD_DIM]), gl.reshape(q_ok, [G * R, HEAD_DIM]), G * R, HEAD_DIM,
              HW_E4M3, HW_E2M1)
  q = gl.reshape(q.to(gl.float16), [G, R, HEAD_DIM])  # exact
  if PACK:  # Q^T in the first half of the columns (the first 32 keys' scores), then in the second
    QF: gl.constexpr = q.type.layout
    lo = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, QF)))[None, :, None] < QR
    qt_lo = gl.convert_layout(gl.permute(_q_order(gl.where(lo, q, 0.0), HEAD_DIM), [0, 2, 1]), B_OP)
    qt_hi = gl.convert_layout(gl.permute(_q_order(gl.where(lo, 0.0, q), HEAD_DIM), [0, 2, 1]), B_OP)
  else:
    qt = gl.convert_layout(gl.permute(_q_order(q, HEAD_DIM), [0, 2, 1]), B_OP)

  # Shared memory: STAGES tiles of each array and KV head, laid out so that the operands' reads do not conflict.
  kc_s = gl.allocate_shared_memory(gl.int32, [STAGES, G, 64, NW], codes_smem_layout(HEAD_DIM, G))
  vc_s = gl.allocate_shared_memory(gl.int32, [STAGES, G, 64, NW], codes_smem_layout(HEAD_DIM, G))
  ks_s = gl.allocate_shared_memory(gl.uint8, [STAGES, G, 64, NB], scales_smem_layout(HEAD_DIM, G))
  vs_s = gl.allocate_shared_memory(gl.uint8, [STAGES, G, 64, NB], scales_smem_layout(HEAD_DIM, G))
  kc_at, kc_key = _copy_offsets(copy_layout(NW, 4, G), G, NW, stride_kck // 4, KC_T // 4)
  vc_at, _ = _copy_offsets(copy_layout(NW, 4, G), G, NW, stride_vck // 4, VC_T // 4)
  ks_at, ks_key = _copy_offsets(copy_layout(NB, NB, G), G, NB, stride_ksk, KS_T)
  vs_at, _ = _copy_offsets(copy_layout(NB, NB, G), G, NB, stride_vsk, VS_T)

  kv_len = gl.minimum(gl.maximum(gl.load(kv_len_ptr + b), 0), capacity)
  tiles = gl.cdiv(kv_len, BLOCK_N)
  chunk = gl.cdiv(tiles, SPLITS)
  t_lo = gl.minimum(split * chunk, tiles)
  t_hi = gl.minimum(t_lo + chunk, tiles)
  for s0 in gl.static_range(STAGES - 1):
    _issue_tile(kc_s.index(s0), ks_s.index(s0), vc_s.index(s0), vs_s.index(s0), kw_ptr, ks_ptr, vw_ptr, vs_ptr, kc_at,
                ks_at, vc_at, vs_at, kc_key, ks_key,
                _page(b, t_lo + s0, t_hi, pt_ptr, pages_per_seq, num_pages, PAGE_SIZE), kvh0, t_lo + s0, t_hi,
                kv_len, stride_kcp, stride_kck, stride_ksp, stride_ksk, stride_vcp, stride_vck, stride_vsp, stride_vsk,
                KC_T, KS_T, VC_T, VS_T, PAGE_SIZE)
  next_page = _page(b, t_lo + STAGES - 1, t_hi, pt_ptr, pages_per_seq, num_pages, PAGE_SIZE)

  qk_scale = scale * LOG2E * 64.0  # log2 units; the values are read 2**6 too small (E4M3 conversion)
  if PACK:  # the softmax's tensors: S^T unpacked, [G, 64, QR]
    SL: gl.constexpr = _unpack(gl.zeros([G, 32, R], gl.float32, layout=MMA)).type.layout
  else:
    SL: gl.constexpr = MMA
  ROW_S: gl.constexpr = gl.SliceLayout(1, SL)
  mrow = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL)))
  kappa = (mrow & 7) * 8 + (mrow >> 4) * 2 + ((mrow >> 3) & 1)  # the key of row m of S^T
  r_s = gl.arange(0, QR, layout=gl.SliceLayout(0, ROW_S))[None, :]
  limit = kv_len + gl.zeros([G, QR], gl.int32, layout=ROW_S)  # keys below it are visible to the query row
  if IS_CAUSAL:
    limit = gl.minimum(limit, kv_len - tq + r_s // group + 1)
  limit = gl.where(r_s < rows, limit, 0)
  m = gl.full([G, QR], float("-inf"), gl.float32, layout=ROW_S)
  l = gl.zeros([G, QR], gl.float32, layout=ROW_S)
  acc = gl.zeros([G, HEAD_DIM, R], gl.float32, layout=MMA)

  for i in range(0, t_hi - t_lo):
    tile = t_lo + i
    async_copy.wait_group(STAGES - 2)  # tile i is in shared memory (this thread's copies) ...
    gl.thread_barrier()  # ... and every thread's; and every thread is done reading the stage refilled below
    st = (i + STAGES - 1) % STAGES
    if PROBE != 2:
      _issue_tile(kc_s.index(st), ks_s.index(st), vc_s.index(st), vs_s.index(st), kw_ptr, ks_ptr, vw_ptr, vs_ptr,
                  kc_at, ks_at, vc_at, vs_at, kc_key, ks_key, next_page, kvh0, tile + STAGES - 1, t_hi, kv_len,
                  stride_kcp, stride_kck, stride_ksp, stride_ksk, stride_vcp, stride_vck, stride_vsp, stride_vsk,
                  KC_T, KS_T, VC_T, VS_T, PAGE_SIZE)
      next_page = _page(b, tile + STAGES, t_hi, pt_ptr, pages_per_seq, num_pages, PAGE_SIZE)
    cur = i % STAGES if PROBE != 2 else i % (STAGES - 1)
    if PROBE != 1:
      if PACK:
        s = _scores_packed(kc_s.index(cur), ks_s.index(cur), qt_lo, qt_hi, HEAD_DIM, G, R)
      else:
        s = _scores(kc_s.index(cur), ks_s.index(cur), qt, HEAD_DIM, G, R)
      m_new, alpha, p, pq = _probs(s, tile, kappa, limit, m, qk_scale, G, QR, P_ROW_RANGE, HW_E4M3, HW_E2M1)
      l = l * alpha + gl.sum(p, axis=1)
      if PACK:
        acc = _pv_packed(vc_s.index(cur), vs_s.index(cur), pq, acc, alpha, HEAD_DIM, G, R)
      else:
        acc = _pv(vc_s.index(cur), vs_s.index(cur), pq, acc, alpha, HEAD_DIM, G)
      m = m_new

  async_copy.wait_group(0)  # nothing in flight at exit
  acc = acc * 64.0  # back to V's units
  if PACK:  # each query row's sums over the two halves of the keys
    acc = gl.sum(gl.reshape(acc, [G, HEAD_DIM, 2, QR]), axis=2)
  h_s = gl.arange(0, G, layout=gl.SliceLayout(1, ROW_S))[:, None]
  if SPLITS == 1:
    AQ: gl.constexpr = gl.SliceLayout(1, acc.type.layout)  # l per row, as acc's rows (packed: summed) hold them
    l = gl.convert_layout(l, AQ)
    empty = l == 0.0
    inv = gl.where(empty, 0.0, gl.div_rn(gl.full([G, QR], 1.0, gl.float32, layout=AQ), gl.where(empty, 1.0, l)))
    out = _o_channels(gl.where(empty[:, None, :], 0.0, acc * inv[:, None, :]), HEAD_DIM)
    OL: gl.constexpr = out.type.layout
    h_out, r_out, d_out = _index3(G, QR, HEAD_DIM, OL)
    o_rows = (b.to(gl.int64) * stride_ob + (r_out // group).to(gl.int64) * stride_ot
              + ((kvh0 + h_out) * group + r_out % group).to(gl.int64) * stride_on)
    gl.store(o_ptr + o_rows + d_out, out.to(o_ptr.dtype.element_ty),
             mask=(h_out < G) & (r_out < rows) & (d_out < HEAD_DIM))
  else:  # partial j = (b * K + kvh) * SPLITS + split, as the Triton kernel and the combine launch number them; of
    # its BLOCK_M rows, the first QR (the others, padding, are never read)
    out = _o_channels(acc, HEAD_DIM)
    OL: gl.constexpr = out.type.layout
    h_out, r_out, d_out = _index3(G, QR, HEAD_DIM, OL)
    part = (b.to(gl.int64) * kv_heads + kvh0 + h_out) * SPLITS + split
    gl.store(part_acc_ptr + (part * R + r_out) * HEAD_DIM + d_out, out)
    part_s = (b.to(gl.int64) * kv_heads + kvh0 + h_s) * SPLITS + split
    gl.store(part_ml_ptr + part_s * 2 * R + r_s, m)
    gl.store(part_ml_ptr + part_s * 2 * R + R + r_s, l)
