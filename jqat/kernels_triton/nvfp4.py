"""NVFP4 fake quantization as Triton device functions and a standalone kernel (docs/NUMERICS.md, section 2).

Framework-free: imports Triton only. The device functions quantize a 2-D FP32
tile in blocks of 16 along its last axis and are shared by the attention
kernels; ``fake_quantize_kernel`` applies them to a whole tensor, and
``fake_quantize_cols_kernel`` (``fq_tile_t``) quantizes along axis 0 of a
2-D tensor in its own layout (qat_matmul's weights).

No plain ``/``: Triton's FP32 division is not guaranteed correctly rounded.

- E4M3 block scale ``e4m3(max(amax / 6, 2**-9))``: the IEEE quotient (an FMA
  correction compiled, ``tl.div_rn`` in the interpreter); then either the
  hardware ``cvt.rn.satfinite.e4m3x2.f32`` (through ``.to(tl.float8e4nv)``,
  sm_89+) or a software round-to-nearest-even on the FP32 bits (Ampere and the
  interpreter).
- E2M1 code of ``x / s``: in software, ``|x|`` is compared with the exact
  products ``s * b`` of the seven rounding boundaries ``b`` (a correctly
  rounded quotient reaches ``b`` only when ``|x| == s * b``), three of them per
  element in a decision tree (Ampere and the interpreter); compiled on sm_89+
  (with ``HW_E4M3``), the correctly rounded quotient from an approximate
  reciprocal and one FMA correction, rounded onto the E2M1 grid by adding and
  subtracting a power of two (fewer instructions, checked against the tree for
  every scale and FP32 value on the H200); on sm_100+ the native
  ``cvt.rn.satfinite.e2m1x2.f32`` rounds ``tl.div_rn(x, s)``.

Host side, :func:`quant_flags` picks the paths from the compute capability.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 16


def quant_flags(compute_capability, interpret: bool = False) -> dict:
  """Constexpr flags for the device functions: ``{"HW_E4M3": bool, "HW_E2M1": bool}``.

  compute_capability: ``90``, ``"9.0"``, ``9.0`` or ``(9, 0)``; None means no GPU.
  interpret: True under ``TRITON_INTERPRET=1`` (no inline PTX, no FP8 hardware).
  """
  if interpret or compute_capability is None:
    return {"HW_E4M3": False, "HW_E2M1": False}
  if isinstance(compute_capability, (tuple, list)):
    cc = 10 * int(compute_capability[0]) + int(compute_capability[1])
  elif isinstance(compute_capability, str) or isinstance(compute_capability, float):
    major, _, minor = str(compute_capability).partition(".")
    cc = 10 * int(major) + int(minor or 0)
  else:
    cc = int(compute_capability)
  # cvt.rn.satfinite.e4m3x2.f32 exists from sm_89; e2m1x2 from sm_100 (and sm_120).
  return {"HW_E4M3": cc >= 89, "HW_E2M1": cc >= 100}


@triton.jit
def corrected_quotient(x, s, r):
  """``x / s`` from ``r`` ~ ``1 / s``: ``y0 = x * r``, then one correction ``y0 + r * (x - s * y0)`` in two FMAs
  (the residual is exact). With ``r = RN(1 / s)`` and ``y0`` normal it is ``RN(x / s)`` (Markstein's theorem;
  the E4M3 scales' ``amax / 6``); with a faithful ``r`` (``rcp_approx``) it lies within about 2**-44 relative of
  ``x / s`` and is exact when the quotient is representable, which the E2M1 roundings need (``e2m1_dequant``,
  jqat/kernels_triton/rope_qdq.py). ``x = +Inf`` gives NaN (``fma(Inf, -s, Inf)``)."""
  y = x * r
  return tl.fma(tl.fma(y, -s, x), r, y)


@triton.jit
def e4m3_block_scale(amax, HW_E4M3: tl.constexpr):
  """``e4m3(max(amax / 6, 2**-9))`` RNE, saturating at 448; ``amax >= 0`` FP32 (may be +Inf).

  ``amax / 6`` is the correctly rounded FP32 quotient. Compiled (HW_E4M3), it is
  formed without ``div.rn``'s range check and slow-path branch: with
  ``y = RN(1/6)``, ``q0 = RN(amax * y)`` is within one ulp of the quotient, the
  residual ``r = amax - 6 * q0`` is exact in one FMA, and ``RN(q0 + r * y)`` is
  the correctly rounded quotient (Markstein's theorem; ``corrected_quotient``) wherever ``q0`` is a
  normal number. Below that the quotient is far under the 2**-9 floor; above,
  ``amax`` is first clamped to 2688 = 6 * 448, whose scale is already the
  saturated 448 (this also maps +Inf to 448). The interpreter has no fused
  multiply-add (it rounds ``a * b`` first), so it keeps ``tl.div_rn``.
  """
  amax = tl.minimum(amax, 2688.0)
  if HW_E4M3:
    t = corrected_quotient(amax, 6.0, 0.16666667163372039795)  # RN(1/6) = 0x3E2AAAAB
  else:
    t = tl.div_rn(amax, 6.0)
  t = tl.maximum(t, 0.001953125)
  if HW_E4M3:
    s = t.to(tl.float8e4nv).to(tl.float32)  # cvt.rn.satfinite: RNE, +Inf and >448 -> 448
  else:
    t = tl.minimum(t, 448.0)  # saturate first so the rounding below cannot carry into Inf
    # Normal E4M3 (t >= 2**-6): keep 3 mantissa bits, ties to even, on the FP32 bits.
    b = t.to(tl.int32, bitcast=True)
    b = (b + 0x7FFFF + ((b >> 20) & 1)) & -0x100000
    normal = b.to(tl.float32, bitcast=True)
    # Subnormal E4M3: multiples of 2**-9; t * 512 is exact and adding 2**23 rounds it
    # to an integer with the FPU's ties-to-even.
    sub = ((t * 512.0 + 8388608.0) - 8388608.0) * 0.001953125
    s = tl.where(t >= 0.015625, normal, sub)
  return s


@triton.jit
def rcp_approx(x):
  """``1 / x`` by one MUFU.RCP (``rcp.approx.ftz.f32``, within an ulp; compiled code only), where ``1.0 / x``
  compiles to a full-range division with its range checks. For callers that correct the quotient afterwards."""
  return tl.inline_asm_elementwise(asm="rcp.approx.ftz.f32 $0, $1;", constraints="=r,r", args=[x],
                                   dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def round_grid(y, MIN_EXP_BITS: tl.constexpr, SHIFT_BITS: tl.constexpr):
  """RNE of non-negative FP32 ``y`` keeping ``23 - SHIFT`` mantissa bits, with the spacing of the
  binade starting at ``MIN_EXP`` below it (the subnormal grid of the small format).

  ``M = 2**(e + SHIFT)`` with ``e = max(exponent(y), MIN_EXP)``: ``y + M`` rounds (FP32 RNE)
  onto multiples of ``ulp(M) = 2**(e + SHIFT - 23)``, and subtracting ``M`` is exact.
  """
  e = tl.maximum(y.to(tl.int32, bitcast=True) & 0x7F800000, MIN_EXP_BITS)
  m = (e + SHIFT_BITS).to(tl.float32, bitcast=True)
  return (y + m) - m


@triton.jit
def round_e2m1(y):
  """RNE of non-negative FP32 ``y <= 6`` onto E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}: 1 mantissa bit, grid .5 below 1."""
  return round_grid(y, 127 << 23, 22 << 23)


@triton.jit
def e2m1_tree(ax, s, AXIS: tl.constexpr):
  """The software E2M1 decision of ``ax / s`` (``ax >= 0`` 3-D, ``s`` its E4M3 block scales with the block axis
  ``AXIS`` reduced away) as three predicates: the code index is ``4 * upper + 2 * mid + odd``.

  Level 1 splits the codes {0..3} | {4..7} at 1.75 (>=), level 2 at 0.75 or 3.5 (>=), level 3 at 0.25, 1.25, 2.5
  or 5 (strict): the same predicates as counting the boundaries crossed, since the boundaries increase. The seven
  products ``s * b`` are exact (``b`` has at most 3 significant bits, ``s`` 4) and formed once per block.
  """
  t025 = tl.expand_dims(s * 0.25, AXIS)
  t075 = tl.expand_dims(s * 0.75, AXIS)
  t125 = tl.expand_dims(s * 1.25, AXIS)
  t175 = tl.expand_dims(s * 1.75, AXIS)
  t250 = tl.expand_dims(s * 2.5, AXIS)
  t350 = tl.expand_dims(s * 3.5, AXIS)
  t500 = tl.expand_dims(s * 5.0, AXIS)
  upper = ax >= t175
  mid = ax >= tl.where(upper, t350, t075)
  odd = ax > tl.where(upper, tl.where(mid, t500, t250), tl.where(mid, t125, t025))
  return upper, mid, odd


@triton.jit
def e2m1_dequant(ax, s, AXIS: tl.constexpr, HW_E2M1: tl.constexpr, QUOTIENT: tl.constexpr = False):
  """``|e2m1(ax / s)| * s`` in FP32, RNE, saturating at 6; ``ax >= 0`` 3-D, ``s`` its E4M3 block
  scales with the block axis ``AXIS`` reduced away (``s`` expands along ``AXIS`` to broadcast).

  Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4 (strict ``>`` where
  the lower code is even). +Inf gives 6 * s. A NaN element gives 0 (software) or 6 * s (QUOTIENT): every
  caller makes a block holding a NaN NaN by itself (``fq_tile``'s flag, ``fq_probs_t``'s NaN scale) or its
  whole row NaN (``fq_probs``), so no result depends on which.

  Software path: the E2M1 code is found by a three-level decision tree on the
  exact threshold products ``s * b`` (``b`` has at most 3 significant bits and
  ``s`` 4, so each product is exact in FP32). The seven products are formed on
  the reduced ``s``, once per block: on an expanded ``s`` Triton repeats them
  for every element (each thread holds copies of the broadcast scale).

  QUOTIENT (compiled code only: it needs a fused multiply-add; the callers pass ``HW_E4M3``): rounds the
  correctly rounded quotient ``y = RN(ax / s)``, which lies on the same side of every boundary ``b`` as the exact
  one and equals ``b`` only when the quotient does. (If ``ax != s * b``, both are FP32 values and ``s * b`` has at
  most 7 significant bits, so ``|ax - s * b| >= ulp(s * b)`` unless ``s * b`` is a power of two, where ``s`` is
  one and the quotient exact; divided by ``s`` (mantissa below 2) that is more than half an ulp of ``b``.)
  ``y``: ``y0 = ax * r`` with ``r`` the hardware's approximate ``1 / s`` (per block), then
  ``y0 + r * (ax - s * y0)`` in two FMAs: the residual is exact and the corrected value is within about 2**-44
  relative of ``ax / s``, while a quotient by a 4-bit ``s`` is never closer than about 2**-28 to a midpoint
  between FP32 values, so its rounding is ``RN(ax / s)``. Then ``min(y, 6)`` and RNE onto the grid of ``y``'s
  binade (0.5 below 2, then 1, then 2) as ``(y + M) - M`` with ``M = 2**(max(e, 0) + 22)``, whose FP32 ulp is
  that spacing; ties go to the even multiple, which is E2M1's even code. +Inf gives a NaN residual, which
  ``min`` turns into 6. ``tests/test_nvfp4_triton.py`` compares this path with the tree for every E4M3 scale
  and every non-negative FP32 value on the GPU (equal on the H200; without the FMA correction it is not).
  """
  if HW_E2M1:
    s3 = tl.expand_dims(s, AXIS)
    y = tl.div_rn(ax, s3)
    h = tl.inline_asm_elementwise(
        asm="""{
        .reg .b8 q;
        .reg .b16 lo, hi;
        .reg .b32 h2;
        cvt.rn.satfinite.e2m1x2.f32 q, $1, $1;
        cvt.rn.f16x2.e2m1x2 h2, q;
        mov.b32 {lo, hi}, h2;
        mov.b16 $0, lo;
        }""",
        constraints="=h,r",
        args=[y],
        dtype=tl.float16,
        is_pure=True,
        pack=1,
    )
    out = h.to(tl.float32) * s3
  elif QUOTIENT:
    s3 = tl.expand_dims(s, AXIS)
    r3 = tl.expand_dims(rcp_approx(s), AXIS)  # one MUFU.RCP per block
    y = corrected_quotient(ax, s3, r3)  # RN(ax / s)
    out = round_e2m1(tl.minimum(y, 6.0)) * s3  # min also takes a NaN (from +Inf) to 6
  else:
    upper, mid, odd = e2m1_tree(ax, s, AXIS)
    even = tl.where(upper, tl.where(mid, 4.0, 2.0), tl.where(mid, 1.0, 0.0))  # codes 0, 2, 4, 6
    mag = tl.where(odd, tl.maximum(even * 1.5, 0.5), even)  # the next code: 0.5, 1.5, 3, 6
    out = mag * tl.expand_dims(s, AXIS)
  return out


@triton.jit
def fq_tile(x, valid, ROWS: tl.constexpr, COLS: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr,
            ALL_VALID: tl.constexpr = False):
  """Fake-quantizes ``x: [ROWS, COLS] fp32`` in blocks of 16 along axis 1 (COLS % 16 == 0).

  valid: [ROWS, COLS] bool. Invalid elements are ignored for the amax and the
  NaN check (a padded tail must not shrink or poison its block) and give +0.
  A NaN among a block's valid elements makes the block NaN (0x7FC00000 throughout; :func:`cast_fq` keeps that
  pattern in 16 bits); +-Inf saturates.
  ALL_VALID: every element is valid (``valid`` is not read).
  """
  NB: tl.constexpr = COLS // 16
  x3 = tl.reshape(x, [ROWS, NB, 16])
  ax = tl.abs(x3)
  if not ALL_VALID:
    v3 = tl.reshape(valid, [ROWS, NB, 16])
    ax = tl.where(v3, ax, 0.0)
  # One reduction gives the amax and the NaN flag: the maximum propagates NaN (max.NaN, a plain max's cost; a
  # separate flag reduction took about 2 instructions per element of the quantize pass). Only the flag is read
  # from it: the NaN written is the constant below, never the reduction's NaN (whose payload, 0x7FFF, once
  # reached the output in some launch configurations on the H200).
  amax = tl.reduce(ax, 2, _max_nan)
  nan = amax != amax
  s = e4m3_block_scale(tl.where(nan, 0.0, amax), HW_E4M3)
  mag = e2m1_dequant(ax, s, 2, HW_E2M1, HW_E4M3)
  # Copy the sign bit instead of negating: Triton lowers -x to 0 - x, which loses -0.
  sign = x3.to(tl.int32, bitcast=True) & -0x80000000
  out = (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
  out = tl.where(nan[:, :, None], float("nan"), out)
  if not ALL_VALID:
    out = tl.where(v3, out, 0.0)
  return tl.reshape(out, [ROWS, COLS])


@triton.jit
def cast_fq(y, dtype: tl.constexpr, COMPILED: tl.constexpr):
  """:func:`fq_tile`'s FP32 result in ``dtype`` (bf16, fp16 or fp32): its values unchanged, its NaN blocks canonical.

  Its values are exact in bf16 and fp16 (an E2M1 value times an E4M3 scale: at most 6 significant bits, within
  2**-10 .. 2688), and its NaN is the constant 0x7FC00000, written as 0x7FC0 (bf16: its high half) and 0x7E00 (fp16:
  ``.to`` of ``where(nan, NaN, v)``, whose constant LLVM converts at compile time; a conversion at run time would
  write the GPU's 0x7FFF instead). COMPILED (compiled code; callers pass ``HW_E4M3``) and bf16: the high halves of
  two FP32 values by one ``prmt`` per pair, where ``.to(tl.bfloat16)`` of ``where(nan, NaN, v)`` compiled to a
  conversion of ``v`` and a select per 16-bit half with its unpacking and repacking (LLVM moves the conversion into
  the select's arms), about 2.5 instructions per element of the quantize pass instead of 1.5.
  """
  if COMPILED and dtype == tl.bfloat16:
    return tl.inline_asm_elementwise(asm="prmt.b32 $0, $1, $2, 0x7632;", constraints="=r,r,r", args=[y],
                                     dtype=tl.bfloat16, is_pure=True, pack=2)
  else:
    return y.to(dtype)


@triton.jit
def _max_nan(a, b):
  return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _prob_block_scales(p3, AXIS: tl.constexpr, HW_E4M3: tl.constexpr):
  """E4M3 scales of probability blocks (``AXIS`` the block axis): NaN for a block that holds a NaN.

  The block maximum propagates NaN (``max.NaN``, the cost of a plain max); a NaN scale then
  makes every element of its block NaN through the final ``mag * s`` (docs/NUMERICS.md, section 2.2).
  """
  amax = tl.reduce(p3, AXIS, _max_nan)
  s = e4m3_block_scale(amax, HW_E4M3)
  return tl.where(amax != amax, float("nan"), s)


@triton.jit
def fq_probs(p, ROWS: tl.constexpr, COLS: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """``fq_tile`` for the forward's probabilities ``p: [ROWS, COLS] fp32`` (blocks along axis 1).

  Precondition: ``p >= 0`` and exactly +0 at masked positions. Then a masked zero never
  raises a block's amax and quantizes to +0 by itself, so the mask and sign handling of
  ``fq_tile`` can be skipped on this hot path. A NaN probability is not carried by the
  quantized values here (plain ``max``, the cheaper reduction): the forward's row sum
  already makes its whole row of O, O' and lse NaN.
  """
  NB: tl.constexpr = COLS // 16
  p3 = tl.reshape(p, [ROWS, NB, 16])
  s = e4m3_block_scale(tl.max(p3, axis=2), HW_E4M3)
  out = e2m1_dequant(p3, s, 2, HW_E2M1, HW_E4M3)
  return tl.reshape(out, [ROWS, COLS])


@triton.jit
def fq_probs_t(pt, ROWS: tl.constexpr, COLS: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """``fq_probs`` with the blocks along axis 0: ``pt: [ROWS, COLS]``, ROWS % 16 == 0, and NaN kept.

  For the dK/dV kernel, which holds P transposed (keys on axis 0) and must quantize
  along keys. Here nothing else carries a NaN probability into dV, so a block holding
  one is NaN throughout (docs/NUMERICS.md, section 2.2).
  """
  NB: tl.constexpr = ROWS // 16
  p3 = tl.reshape(pt, [NB, 16, COLS])
  out = e2m1_dequant(p3, _prob_block_scales(p3, 1, HW_E4M3), 1, HW_E2M1, HW_E4M3)
  return tl.reshape(out, [ROWS, COLS])


@triton.jit
def _fake_quantize_tile(x_ptr, rows, cols, stride_x, stride_out, out_ptr, tile_r, tile_c, BLOCK_R: tl.constexpr,
                        BLOCK_C: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr, EVEN: tl.constexpr):
  """``out = fq(x)`` on tile ``(tile_r, tile_c)`` of ``[BLOCK_R, BLOCK_C]`` of :func:`fake_quantize_kernel`."""
  r = tile_r * BLOCK_R + tl.arange(0, BLOCK_R)
  c = tile_c * BLOCK_C + tl.arange(0, BLOCK_C)
  r64 = r.to(tl.int64)[:, None]
  x_at, out_at = x_ptr + r64 * stride_x + c[None, :], out_ptr + r64 * stride_out + c[None, :]
  if EVEN:
    y = fq_tile(tl.load(x_at).to(tl.float32), None, BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1, True)
    tl.store(out_at, cast_fq(y, out_ptr.dtype.element_ty, HW_E4M3))
  else:
    valid = (r[:, None] < rows) & (c[None, :] < cols)
    y = fq_tile(tl.load(x_at, mask=valid, other=0.0).to(tl.float32), valid, BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1)
    tl.store(out_at, cast_fq(y, out_ptr.dtype.element_ty, HW_E4M3), mask=valid)


@triton.jit
def fake_quantize_kernel(x_ptr, rows, cols, stride_x, stride_out, out_ptr, BLOCK_R: tl.constexpr,
                         BLOCK_C: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr,
                         EVEN: tl.constexpr = False):
  """``out = fq(x)`` along the last axis of a 2-D view ``x: [rows, cols]`` (bf16, fp16 or fp32).

  Grid: (cdiv(rows, BLOCK_R), cdiv(cols, BLOCK_C)); BLOCK_C % 16 == 0, so
  blocks of 16 start at column 0 and a ragged tail block is masked. Row
  offsets are 64-bit: rows * stride may exceed 2**31.
  EVEN: ``rows % BLOCK_R == 0`` and ``cols % BLOCK_C == 0`` (no tile has a tail: no masks).
  """
  _fake_quantize_tile(x_ptr, rows, cols, stride_x, stride_out, out_ptr, tl.program_id(0), tl.program_id(1), BLOCK_R,
                      BLOCK_C, HW_E4M3, HW_E2M1, EVEN)


def fake_quantize_launch(rows: int, cols: int) -> tuple[tuple[int, int], dict]:
  """Grid and launch parameters of :func:`fake_quantize_rows_kernel` for ``rows`` rows of ``cols`` channels."""
  # 16 elements per thread (2048 per program of 4 warps): 26% faster on the H200 than 32 at D = 64, 128 and 256,
  # bit for bit the same output (32 held 94 registers: 31% occupancy).
  block_c = min(128, triton.next_power_of_2(cols))
  block_r = max(1, 2048 // block_c)
  grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
  even = rows % block_r == 0 and cols % block_c == 0
  return grid, {"BLOCK_R": block_r, "BLOCK_C": block_c, "EVEN": even, "num_warps": 4, "num_stages": 1}


@triton.jit
def fake_quantize_rows_kernel(x_ptr, rows, cols, stride_x, stride_out, out_ptr, BLOCK_R: tl.constexpr,
                              BLOCK_C: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr,
                              EVEN: tl.constexpr = False):
  """``nvfp4.fake_quantize_kernel`` (same arguments, same result) for ``cols % 16 == 0`` and strides
  that are multiples of 16, as for Q, K, V here (D % 16 == 0).

  The hints let the compiler use 16-byte loads and stores; without them (jax-triton
  does not specialize integers) it emitted 2-byte LDG.E.U16 / STG.E.U16.
  """
  fake_quantize_kernel(x_ptr, rows, cols // 16 * 16, stride_x // 16 * 16, stride_out // 16 * 16, out_ptr, BLOCK_R,
                       BLOCK_C, HW_E4M3, HW_E2M1, EVEN)


def fake_quantize_many_launch(rows: tuple[int, ...], cols: int) -> tuple[tuple[int, int], dict]:
  """Grid and launch parameters of :func:`fake_quantize_rows2_kernel` (two tensors) or
  :func:`fake_quantize_rows3_kernel` (three) for tensors of ``rows[i]`` dense rows of ``cols`` channels: each
  tensor's tiles are those of :func:`fake_quantize_launch`, one after the other along the grid's first axis."""
  grids, params = zip(*(fake_quantize_launch(r, cols) for r in rows))
  launch = {key: params[0][key] for key in ("BLOCK_R", "BLOCK_C", "num_warps", "num_stages")}
  launch.update({f"EVEN{i}": p["EVEN"] for i, p in enumerate(params)})
  return (sum(g[0] for g in grids), grids[0][1]), launch


@triton.jit
def _fake_quantize_rows_of(x_ptr, rows, cols, out_ptr, tile_r, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                           HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr, EVEN: tl.constexpr):
  """Tile ``tile_r`` of one tensor of dense rows (stride ``cols``, ``cols % 16 == 0``: the hints as in
  :func:`fake_quantize_rows_kernel`)."""
  _fake_quantize_tile(x_ptr, rows, cols // 16 * 16, cols // 16 * 16, cols // 16 * 16, out_ptr, tile_r,
                      tl.program_id(1), BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1, EVEN)


@triton.jit
def fake_quantize_rows2_kernel(x0_ptr, x1_ptr, rows0, rows1, cols, out0_ptr, out1_ptr, BLOCK_R: tl.constexpr,
                               BLOCK_C: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr,
                               EVEN0: tl.constexpr, EVEN1: tl.constexpr):
  """``out_i = fq(x_i)`` for two tensors of dense rows in one launch (:func:`fake_quantize_many_launch`): the same
  tiles and results as one :func:`fake_quantize_rows_kernel` launch per tensor, for one launch's host cost instead
  of one per tensor (docs/PERFORMANCE.md, section 5)."""
  t = tl.program_id(0)
  n0 = tl.cdiv(rows0, BLOCK_R)
  if t < n0:
    _fake_quantize_rows_of(x0_ptr, rows0, cols, out0_ptr, t, BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1, EVEN0)
  else:
    _fake_quantize_rows_of(x1_ptr, rows1, cols, out1_ptr, t - n0, BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1, EVEN1)


@triton.jit
def fake_quantize_rows3_kernel(x0_ptr, x1_ptr, x2_ptr, rows0, rows1, rows2, cols, out0_ptr, out1_ptr, out2_ptr,
                               BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, HW_E4M3: tl.constexpr,
                               HW_E2M1: tl.constexpr, EVEN0: tl.constexpr, EVEN1: tl.constexpr,
                               EVEN2: tl.constexpr):
  """:func:`fake_quantize_rows2_kernel` for three tensors."""
  t = tl.program_id(0)
  n0 = tl.cdiv(rows0, BLOCK_R)
  n1 = tl.cdiv(rows1, BLOCK_R)
  if t < n0:
    _fake_quantize_rows_of(x0_ptr, rows0, cols, out0_ptr, t, BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1, EVEN0)
  elif t < n0 + n1:
    _fake_quantize_rows_of(x1_ptr, rows1, cols, out1_ptr, t - n0, BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1, EVEN1)
  else:
    _fake_quantize_rows_of(x2_ptr, rows2, cols, out2_ptr, t - n0 - n1, BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1, EVEN2)


# ----------------------------------------------------------------------------- blocks along axis 0 (qat_matmul's W)


@triton.jit
def fq_tile_t(x, ROWS: tl.constexpr, COLS: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """:func:`fq_tile` with the blocks along axis 0: ``x: [ROWS, COLS] fp32``, ROWS % 16 == 0, every element valid.

  The same decisions element by element (amax, NaN flag, scale, code, sign, the constant NaN) on the split
  ``[ROWS // 16, 16, COLS]``: no transpose. Tails of a tensor are whole columns or whole blocks of 16 rows (a
  tensor of ``rows % 16 == 0``), loaded as 0 and never stored, so no mask enters the amax.
  """
  NB: tl.constexpr = ROWS // 16
  x3 = tl.reshape(x, [NB, 16, COLS])
  ax = tl.abs(x3)
  amax = tl.reduce(ax, 1, _max_nan)  # as in fq_tile: only the NaN flag is read from a NaN amax
  nan = amax != amax
  s = e4m3_block_scale(tl.where(nan, 0.0, amax), HW_E4M3)
  mag = e2m1_dequant(ax, s, 1, HW_E2M1, HW_E4M3)
  sign = x3.to(tl.int32, bitcast=True) & -0x80000000
  out = (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
  out = tl.where(nan[:, None, :], float("nan"), out)
  return tl.reshape(out, [ROWS, COLS])


def fake_quantize_cols_launch(rows: int, cols: int, stride_x: int, stride_out: int) -> tuple[tuple[int, int], dict]:
  """Grid and launch parameters of :func:`fake_quantize_cols_kernel` for ``x: [rows, cols]`` (``rows % 16 == 0``)
  with row strides ``stride_x`` (input) and ``stride_out`` (output).

  The tiles of :func:`fake_quantize_launch` (16 elements per thread, 4 warps: 2048 per program), here one block
  of 16 rows by 128 columns where the tensor is that wide. ALIGN: the largest power of two up to 16 dividing both
  strides and ``cols``, shown to the compiler so that it emits 16-byte loads and stores along a row.
  """
  block_c = min(128, max(16, triton.next_power_of_2(cols)))
  block_r = min(max(16, 2048 // block_c), max(16, triton.next_power_of_2(rows)))
  grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
  even = rows % block_r == 0 and cols % block_c == 0
  align = 16
  while align > 1 and (stride_x % align or stride_out % align or cols % align):
    align //= 2
  return grid, {"BLOCK_R": block_r, "BLOCK_C": block_c, "EVEN": even, "ALIGN": align, "num_warps": 4,
                "num_stages": 1}


@triton.jit
def fake_quantize_cols_kernel(x_ptr, rows, cols, stride_x, stride_out, out_ptr, BLOCK_R: tl.constexpr,
                              BLOCK_C: tl.constexpr, HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr,
                              EVEN: tl.constexpr, ALIGN: tl.constexpr):
  """``out = fq(x)`` in blocks of 16 along axis 0 of ``x: [rows, cols]`` (bf16, fp16 or fp32; ``rows % 16 == 0``),
  stored in ``out``'s dtype (bf16, fp16 or fp32: fq values are exact in each), with ``x``'s layout.

  Grid: (cdiv(rows, BLOCK_R), cdiv(cols, BLOCK_C)); BLOCK_R % 16 == 0. Row offsets are 64-bit. ALIGN divides
  ``cols`` and both row strides (:func:`fake_quantize_cols_launch`); EVEN: no tile has a tail (no masks).
  """
  rows = rows // 16 * 16
  cols = cols // ALIGN * ALIGN
  stride_x = stride_x // ALIGN * ALIGN
  stride_out = stride_out // ALIGN * ALIGN
  r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
  c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
  r64 = r.to(tl.int64)[:, None]
  x_at, out_at = x_ptr + r64 * stride_x + c[None, :], out_ptr + r64 * stride_out + c[None, :]
  if EVEN:
    y = fq_tile_t(tl.load(x_at).to(tl.float32), BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1)
    tl.store(out_at, cast_fq(y, out_ptr.dtype.element_ty, HW_E4M3))
  else:
    valid = (r[:, None] < rows) & (c[None, :] < cols)
    y = fq_tile_t(tl.load(x_at, mask=valid, other=0.0).to(tl.float32), BLOCK_R, BLOCK_C, HW_E4M3, HW_E2M1)
    tl.store(out_at, cast_fq(y, out_ptr.dtype.element_ty, HW_E4M3), mask=valid)


# ----------------------------------------------------------------------------- qkv_scale="tensor"

TENSOR_RANGE = tl.constexpr(6.0 * 448.0)  # a slab's amax maps here: E2M1's largest code times E4M3's largest scale


def tensor_scale_launch(head_dim: int) -> dict:
  """Constexprs and launch parameters of :func:`tensor_scale_kernel` and :func:`fake_quantize_scaled_kernel`."""
  d_pad = triton.next_power_of_2(head_dim)
  return {"HEAD_DIM": head_dim, "D_PAD": d_pad, "BLOCK_T": max(1, 4096 // d_pad), "num_warps": 4, "num_stages": 1}


@triton.jit
def _slab_tile(x_ptr, b, h, t0, t_lim, stride_b, stride_t, stride_h, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
               BLOCK_T: tl.constexpr):
  """Offsets and mask of rows ``[t0, t0 + BLOCK_T)`` (below ``t_lim``) of the (batch, head) slab ``x[b, :, h, :]``.

  The strides are multiples of 16 (rows of D % 16 == 0 contiguous elements); ``// 16 * 16`` shows it to the
  compiler, which then vectorizes the loads (jax-triton does not specialize integer arguments).
  """
  stride_b, stride_t, stride_h = stride_b // 16 * 16, stride_t // 16 * 16, stride_h // 16 * 16
  offs_t = t0 + tl.arange(0, BLOCK_T)
  offs_d = tl.arange(0, D_PAD)
  ok = (offs_t[:, None] < t_lim) & (offs_d[None, :] < HEAD_DIM)
  off = (b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + offs_t.to(tl.int64)[:, None] * stride_t
         + offs_d[None, :])
  return off, ok


@triton.jit
def tensor_scale_kernel(x_ptr, len_ptr, t, heads, stride_b, stride_t, stride_h, enc_ptr, HEAD_DIM: tl.constexpr,
                        D_PAD: tl.constexpr, BLOCK_T: tl.constexpr, HAS_LEN: tl.constexpr):
  """The FP32 encode scale of qkv_scale="tensor" for the (batch, head) ``pid0 // heads, pid0 % heads``.

  x: [B, T, H, D] (strides ``stride_*``, last axis contiguous); len: [B] int32, read only with HAS_LEN (live
  rows ``[0, min(max(len[b], 0), T))``, else all T). ``amax = max |x|`` over the live rows and all D, a NaN
  counting as +Inf; ``enc[b, h] = 2688 / amax`` (correctly rounded) when amax is finite and positive, else 1.
  enc: [B, H] fp32 contiguous. Grid: (B * H,).
  """
  pid = tl.program_id(0)
  b = pid // heads
  h = pid % heads
  t_lim = t
  if HAS_LEN:
    t_lim = tl.minimum(tl.maximum(tl.load(len_ptr + b), 0), t)
  amax = tl.zeros([BLOCK_T, D_PAD], tl.float32)
  for t0 in range(0, t_lim, BLOCK_T):
    off, ok = _slab_tile(x_ptr, b, h, t0, t_lim, stride_b, stride_t, stride_h, HEAD_DIM, D_PAD, BLOCK_T)
    ax = tl.abs(tl.load(x_ptr + off, mask=ok, other=0.0).to(tl.float32))
    amax = tl.maximum(amax, tl.where(ax != ax, float("inf"), ax))  # a max may drop NaN: count it as +Inf
  amax = tl.max(tl.max(amax, axis=1), axis=0)
  ok = (amax > 0.0) & (amax < float("inf"))
  tl.store(enc_ptr + pid, tl.where(ok, tl.div_rn(TENSOR_RANGE, tl.where(ok, amax, 1.0)), 1.0))


@triton.jit
def fake_quantize_scaled_kernel(x_ptr, enc_ptr, t, heads, stride_b, stride_t, stride_h, out_ptr,
                                HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                                HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """``out[b, :, h, :] = fq(enc[b, h] * x[b, :, h, :])`` along D: the first level of qkv_scale="tensor".

  x: [B, T, H, D] bf16, fp16 or fp32 (strides ``stride_*``, last axis contiguous); out: the same shape and
  strides. ``enc * x`` is one FP32 product; the result is an E2M1 value times an E4M3 scale, exact in x's
  dtype. Every row is quantized, live or not (the attention kernels mask the rest). enc: [B, H] fp32
  (:func:`tensor_scale_kernel`). Grid: (cdiv(T, BLOCK_T), B * H).
  """
  pid = tl.program_id(1)
  b = pid // heads
  h = pid % heads
  off, ok = _slab_tile(x_ptr, b, h, tl.program_id(0) * BLOCK_T, t, stride_b, stride_t, stride_h, HEAD_DIM, D_PAD,
                       BLOCK_T)
  x = tl.load(x_ptr + off, mask=ok, other=0.0).to(tl.float32) * tl.load(enc_ptr + pid)
  y = fq_tile(x, ok, BLOCK_T, D_PAD, HW_E4M3, HW_E2M1)
  tl.store(out_ptr + off, cast_fq(y, out_ptr.dtype.element_ty, HW_E4M3), mask=ok)
