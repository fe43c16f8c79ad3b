"""The Triton NVFP4 kernels' own parts against the NumPy oracle, bit for bit (docs/NUMERICS.md, section 2): the
attention kernels' P quantizers, the compiled E4M3 / E2M1 paths against the software ones, NaN block bits under every
launch layout, masked columns, ``quant_flags``. (``fake_quantize_kernel`` on the shared quantizer cases, beside the
XLA quantizer: tests/test_nvfp4.py.)

CPU: the kernels run under ``TRITON_INTERPRET=1`` on torch CPU tensors, with the software E4M3/E2M1 paths. GPU
(``@pytest.mark.gpu``): compiled for the local GPU with the hardware paths ``quant_flags`` picks.
"""

import os

from conftest import HAS_GPU, kernel_device  # noqa: E402

# Before triton is imported: the interpreter on CPU machines, compiled kernels on a GPU.
os.environ.setdefault("TRITON_INTERPRET", "0" if HAS_GPU else "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = triton.language

from cases import boundary_blocks  # noqa: E402
from oracle import E2M1_VALUES, E4M3_VALUES, bits, fq_oracle, round_to_table  # noqa: E402

from jqat.kernels_triton import nvfp4 as knv  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"


def _flags(device):
  if device == "cpu":
    return knv.quant_flags(None, interpret=True)
  return knv.quant_flags(torch.cuda.get_device_capability(), interpret=False)


@triton.jit
def _fq_probs_kernel(x_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, BLOCKS_ON_ROWS: tl.constexpr,
                     HW_E4M3: tl.constexpr, HW_E2M1: tl.constexpr):
  """One [ROWS, COLS] FP32 tile through ``fq_probs`` (blocks along columns) or ``fq_probs_t`` (along rows)."""
  offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
  x = tl.load(x_ptr + offs)
  if BLOCKS_ON_ROWS:
    y = knv.fq_probs_t(x, ROWS, COLS, HW_E4M3, HW_E2M1)
  else:
    y = knv.fq_probs(x, ROWS, COLS, HW_E4M3, HW_E2M1)
  tl.store(out_ptr + offs, y)


def _probability_cases():
  """Non-negative FP32 [64, 64]: every boundary b*s of every E4M3 scale with both float neighbours
  (blocks of 16 with amax 6s), then random blocks over 12 decades, some with zeros (masked keys)."""
  x = np.concatenate([boundary_blocks(np.inf), boundary_blocks(0.0)]).reshape(-1)
  rng = np.random.default_rng(4)
  fill = 64 * 64 - x.size
  rand = (rng.random(fill) * 10.0 ** rng.integers(-12, 1, fill)).astype(np.float32)
  rand[rng.random(fill) < 0.2] = 0.0
  x = np.concatenate([x, rand]).reshape(64, 64)
  x[-1, 3] = x[-2, 40] = x[-3, 63] = np.nan  # a NaN probability makes its block NaN (docs/NUMERICS.md, 2.2)
  return x


@pytest.mark.parametrize("blocks_on_rows", [False, True], ids=["fq_probs", "fq_probs_t"])
def test_probability_quantizer_matches_oracle(blocks_on_rows):
  """The attention kernels' P quantizers (no mask or sign handling) against the oracle, bit for bit."""
  device = kernel_device()
  x = _probability_cases()
  assert x.shape == (64, 64) and (np.isnan(x) | (x >= 0)).all() and np.isnan(x).any()
  tile = np.ascontiguousarray(x.T if blocks_on_rows else x)
  t = torch.from_numpy(tile).to(device)
  out = torch.full_like(t, float("nan"))
  _fq_probs_kernel[(1,)](t, out, ROWS=64, COLS=64, BLOCKS_ON_ROWS=blocks_on_rows, **_flags(device))
  got = out.cpu().numpy()
  got = got.T if blocks_on_rows else got
  want = fq_oracle(x).astype(np.float32)
  if blocks_on_rows:  # the backward's fq(P) keeps NaN blocks
    assert (np.isnan(got) == np.isnan(want)).all(), "NaN blocks differ"
  # The forward's drops a NaN (its row sum carries it): elsewhere both are bitwise the oracle.
  bad = np.nonzero((bits(got) != bits(want)) & ~np.isnan(want) & ~np.isnan(x))
  assert bad[0].size == 0, f"{bad[0].size} mismatches, first x={x[bad][0]} got={got[bad][0]} want={want[bad][0]}"


@triton.jit
def _scale_paths_kernel(mismatch_ptr, BLOCK: tl.constexpr):
  """Mismatches between the compiled and the software ``e4m3_block_scale`` over BLOCK amax bit patterns."""
  pid = tl.program_id(0)
  bits_ = pid * BLOCK + tl.arange(0, BLOCK)  # non-negative int32: every +0..+Inf and positive NaN pattern
  amax = bits_.to(tl.float32, bitcast=True)
  ok = amax == amax
  fast = knv.e4m3_block_scale(amax, True)
  soft = knv.e4m3_block_scale(amax, False)
  bad = ok & (fast.to(tl.int32, bitcast=True) != soft.to(tl.int32, bitcast=True))
  tl.store(mismatch_ptr + pid, tl.sum(bad.to(tl.int32), axis=0))


@pytest.mark.gpu
def test_block_scale_paths_agree_on_every_fp32_gpu():
  """The FMA quotient of the compiled scale path against ``div_rn`` + software E4M3 rounding, for every
  non-negative FP32 amax (2**31 patterns, NaNs excluded); the software path is checked against the
  oracle above."""
  if INTERPRET:
    pytest.skip("compiled-kernel test: run with TRITON_INTERPRET=0")
  block = 1 << 14
  counts = torch.full((2**31 // block,), -1, dtype=torch.int32, device=kernel_device())
  _scale_paths_kernel[(counts.numel(),)](counts, BLOCK=block)
  counts = counts.cpu().numpy()
  assert (counts >= 0).all() and counts.sum() == 0, f"{counts.sum()} mismatches, first block {np.argmax(counts > 0)}"


@triton.jit
def _e2m1_paths_kernel(mismatch_ptr, scales_ptr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
  """Mismatches between the compiled (quotient) and the software (threshold tree) ``e2m1_dequant`` over
  BLOCK * STEPS magnitude bit patterns for one E4M3 scale."""
  s = tl.load(scales_ptr + tl.program_id(1) + tl.zeros([BLOCK // 16], tl.int32))
  bad = tl.zeros([BLOCK // 16, 16], tl.int32)
  for i in range(STEPS):
    bits_ = (tl.program_id(0) * STEPS + i) * BLOCK + tl.arange(0, BLOCK)  # every +0..+Inf and positive NaN pattern
    ax = tl.reshape(bits_.to(tl.float32, bitcast=True), [BLOCK // 16, 16])
    fast = knv.e2m1_dequant(ax, s, 1, False, True)
    soft = knv.e2m1_dequant(ax, s, 1, False, False)
    bad += ((ax == ax) & (fast.to(tl.int32, bitcast=True) != soft.to(tl.int32, bitcast=True))).to(tl.int32)
  tl.atomic_add(mismatch_ptr + tl.program_id(1), tl.sum(tl.sum(bad, axis=1), axis=0))


@pytest.mark.gpu
def test_e2m1_paths_agree_on_every_fp32_and_scale_gpu():
  """The compiled E2M1 rounding (the correctly rounded quotient ``|x| / s`` from an approximate reciprocal and
  an FMA correction, then round-to-nearest-even by adding and subtracting a power of two) against the software
  threshold tree, for every E4M3 scale (2**-9 .. 448) and every non-negative FP32 magnitude (2**31 patterns,
  NaNs excluded: their blocks are NaN by the callers' flags); the tree is checked against the oracle above."""
  if INTERPRET:
    pytest.skip("compiled-kernel test: run with TRITON_INTERPRET=0")
  device = kernel_device()
  scales = torch.tensor(E4M3_VALUES[E4M3_VALUES > 0], dtype=torch.float32, device=device)
  assert scales.numel() == 126
  counts = torch.zeros((scales.numel(),), dtype=torch.int32, device=device)
  block, steps = 2048, 256
  _e2m1_paths_kernel[(2**31 // (block * steps), scales.numel())](counts, scales, BLOCK=block, STEPS=steps)
  counts = counts.cpu().numpy()
  assert counts.sum() == 0, f"{counts.sum()} mismatches, at scales {E4M3_VALUES[E4M3_VALUES > 0][counts > 0]}"


def _fma32(a, b, c):
  """FP32 ``fma(a, b, c)`` with one rounding, in NumPy: ``a * b`` is exact in FP64, TwoSum gives the FP64 sum's
  exact error, which decides the FP32 rounding only when the FP64 sum sits exactly on an FP32 midpoint."""
  p, c64 = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
  s = p + c64
  bb = s - p
  err = (p - (s - bb)) + (c64 - bb)
  r = s.astype(np.float32)
  lo = np.where(r.astype(np.float64) <= s, r, np.nextafter(r, np.float32(-np.inf)))
  hi = np.nextafter(lo, np.float32(np.inf))
  at_mid = (s == (lo.astype(np.float64) + hi.astype(np.float64)) / 2) & (err != 0)
  return np.where(at_mid, np.where(err > 0, hi, lo), r)


@pytest.mark.parametrize("reciprocal_ulps", [-3, -1, 0, 1, 3])
def test_e2m1_quotient_algorithm_matches_oracle(reciprocal_ulps):
  """The arithmetic of ``e2m1_dequant``'s compiled QUOTIENT path, replayed in NumPy with exact FMAs and a
  reciprocal off by ``reciprocal_ulps`` (the hardware's ``rcp.approx`` is within one), against the oracle's
  rounding of the IEEE quotient: for every positive E4M3 scale, on magnitudes at and next to every rounding
  boundary ``s * b`` and at random. The compiled code itself is checked on the GPU (every FP32 value, above)."""
  rng = np.random.default_rng(42)
  f32 = np.float32
  scales = E4M3_VALUES[E4M3_VALUES > 0].astype(f32)
  boundaries = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 6.5, 7.0], f32)
  for s in scales:
    up = down = (s * boundaries).astype(f32)  # exact
    near = [up]
    for _ in range(4):  # the four FP32 neighbours on each side
      up, down = np.nextafter(up, f32(np.inf)), np.nextafter(down, f32(0))
      near += [up, down]
    ax = np.concatenate(near + [(rng.random(4096) * 8 * s).astype(f32), np.array([0, np.inf], f32)]).astype(f32)
    r = f32(f32(1) / s)
    for _ in range(abs(reciprocal_ulps)):
      r = np.nextafter(r, f32(np.inf) if reciprocal_ulps > 0 else f32(0))
    with np.errstate(over="ignore", invalid="ignore"):
      y0 = (ax * r).astype(f32)
      y = _fma32(_fma32(y0, np.full_like(ax, -s), ax), np.full_like(ax, r), y0)
      y = np.where(np.isnan(y), f32(6), np.minimum(y, f32(6)))  # min.f32 returns the non-NaN operand
      e = np.maximum(y.view(np.int32) & 0x7F800000, 127 << 23)
      m = (e + (22 << 23)).astype(np.int32).view(f32)
      got = (((y + m) - m) * s).astype(f32)
      want = (round_to_table(np.where(np.isnan(ax / s), 0, (ax / s).astype(f32)), E2M1_VALUES) * s).astype(f32)
    np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"scale {s}")


@pytest.mark.parametrize("even", [False, True])
@pytest.mark.parametrize("block_r,num_warps", [(8, 4), (16, 4), (32, 4), (32, 8), (64, 2)])
def test_nan_block_bits_do_not_depend_on_launch(block_r, num_warps, even):
  """A NaN block reads 0x7FC0 (bf16) in every layout: on the H200 the block's NaN once took the max.NaN
  result's payload (0x7FFF) in some launch configurations only; the other values are the oracle's.
  even: the unmasked variant (EVEN, no tile with a tail), as the plans launch it for whole tiles."""
  device = kernel_device()
  rng = np.random.default_rng(3)
  x32 = torch.from_numpy(rng.normal(size=(64, 128)).astype(np.float32) * 3).to(torch.bfloat16).float().numpy()
  x32[5, 3], x32[7, 100], x32[9, 17] = np.nan, np.inf, -np.inf
  x = torch.from_numpy(x32).to(torch.bfloat16).to(device)
  out = torch.empty_like(x)
  knv.fake_quantize_rows_kernel[(triton.cdiv(64, block_r), 1)](x, 64, 128, 128, 128, out, BLOCK_R=block_r,
                                                               BLOCK_C=128, EVEN=even, num_warps=num_warps,
                                                               **_flags(device))
  raw = out.view(torch.int16).cpu().numpy().astype(np.uint16)
  assert (raw[5, :16] == 0x7FC0).all() and not np.isnan(out.float().cpu().numpy()[np.arange(64) != 5]).any()
  want = torch.from_numpy(fq_oracle(x32).astype(np.float32)).to(torch.bfloat16).float().numpy()
  np.testing.assert_array_equal(bits(out.float().cpu().numpy()), bits(want))


def test_masked_positions_are_ignored():
  """Columns past ``cols`` are masked: neither their huge values nor their NaN reach the valid blocks."""
  device = kernel_device()
  x = np.random.default_rng(3).standard_normal((4, 40)).astype(np.float32)
  wide = np.concatenate([x, np.full((4, 8), np.nan, np.float32)], axis=1)
  wide[:, 41] = 1e6  # in the same block of 16 as columns 32..39
  t = torch.from_numpy(wide).to(device)
  view = t[:, :40]  # rows keep the wide stride; the kernel reads columns < 40 only
  out = torch.full((4, 40), float("nan"), dtype=torch.float32, device=device)
  knv.fake_quantize_kernel[(1, 1)](view, 4, 40, view.stride(0), out.stride(0), out, BLOCK_R=16, BLOCK_C=64,
                                   **_flags(device))
  assert (bits(out.cpu().numpy()) == bits(fq_oracle(x).astype(np.float32))).all()


def test_quant_flags():
  assert knv.quant_flags(None) == {"HW_E4M3": False, "HW_E2M1": False}
  assert knv.quant_flags((9, 0), interpret=True) == {"HW_E4M3": False, "HW_E2M1": False}
  assert knv.quant_flags((8, 0)) == {"HW_E4M3": False, "HW_E2M1": False}
  assert knv.quant_flags("9.0") == {"HW_E4M3": True, "HW_E2M1": False}
  assert knv.quant_flags(100) == {"HW_E4M3": True, "HW_E2M1": True}
  assert knv.quant_flags((12, 0)) == {"HW_E4M3": True, "HW_E2M1": True}
