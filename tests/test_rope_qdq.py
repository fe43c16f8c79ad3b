"""Tail RoPE + microscaled QDQ (docs/NUMERICS.md, 9): bitwise against the NumPy oracle, and validation (docs/API.md).

The Triton kernel runs here twice: compiled through JAX on a GPU (``gpu``
marker), and on CPU under ``TRITON_INTERPRET=1`` driven with torch tensors, in
a subprocess because the interpreter must be chosen before triton is imported.
"""

import math
import os
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import bits
from oracle_rope import NAN_BF16, fma32, fma32_fraction, rope_qdq_oracle

import jqat._src.rope_qdq_reference as reference
from jqat._src.rope_qdq import rope_qdq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
FP4_32, FP8_32, FP4_16 = ("fp4", 32, "ue8m0"), ("fp8", 32, "ue8m0"), ("fp4", 16, "e4m3")
P = 37  # cache positions

# Shared input specs: (mode, x shape), odd sizes included.
SHAPES = [
    (FP4_32, (1, 1, 128)), (FP4_32, (17, 3, 128)), (FP4_32, (5, 32, 128)),
    (FP8_32, (1, 512)), (FP8_32, (3, 7, 512)), (FP8_32, (2, 3, 5, 512)),
    (FP4_16, (17, 512)), (FP4_16, (2, 9, 512)),
]
MAGNITUDES = (1e-30, 1e-3, 1.0, 3e4)


def _kw(mode):
  return dict(quantization=mode[0], group_size=mode[1], scale_format=mode[2])


def make_cache(rng, p=P):
  """[p, 64] fp32: 32 cosines then 32 sines of position * frequency, as a real RoPE cache."""
  freq = 10000.0 ** (-np.arange(32) / 32)
  ang = np.arange(p)[:, None] * freq[None, :]
  return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


def n_positions(mode, shape):
  return shape[0] if mode == FP4_32 else math.prod(shape[:-1])


def make_positions(rng, mode, shape, dtype=np.int32):
  """Random ids with 0 and P - 1 always present."""
  pos = rng.integers(0, P, n_positions(mode, shape))
  pos[0] = 0
  pos[-1] = P - 1
  return pos.astype(dtype)


def make_x(rng, shape, magnitude):
  x = rng.standard_normal(shape) * magnitude
  x.reshape(-1)[::97] = 0.0
  x.reshape(-1)[1::89] = -0.0
  return x.astype(ml_dtypes.bfloat16)


def random_case(mode, shape, magnitude, pos_dtype=np.int32):
  """x, cache and positions for one parametrized case. The seed is a CRC of the case, not
  ``hash()``: Python randomizes string hashes per process, and a failure must reproduce."""
  rng = np.random.default_rng(zlib.crc32(repr((mode, shape, magnitude)).encode()))
  x, cache = make_x(rng, shape, magnitude), make_cache(rng)
  return x, cache, make_positions(rng, mode, shape, pos_dtype)


def special_rows(mode):
  """Rows that hit the amax floor, exact E2M1/E4M3 ties, signed zeros and saturation.

  Ties sit in the first group of the row (never rotated) so they reach the quantizer as
  written; the rotated tail gets zeros of both signs and values at the floor.
  """
  width, group = (128, 32) if mode == FP4_32 else (512, mode[1])
  rows = []
  rows.append(np.zeros(width))                                  # zero row: floor scale
  rows.append(np.where(np.arange(width) % 2, -0.0, 0.0))       # signed zeros, tail included
  tiny = np.full(width, 2.0**-120)                              # fp4/ue8m0 floor territory (normal bf16)
  tiny[::3] = -2.0**-118
  rows.append(tiny)
  rows.append(np.full(width, 1e-5))                            # below the fp8 floor 1e-4
  rows.append(np.full(width, 6 * 2.0**-9 * 0.5))               # below the e4m3 floor 6 * 2**-9
  if mode[0] == "fp4":
    # amax 6 gives scale 1 for both UE8M0 and E4M3: the boundaries are exact ties.
    ties = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -0.0]
  else:
    # amax 448 gives scale 1: E4M3 midpoints (ties to even) and the subnormal step.
    ties = [448.0, 1.0625, 1.1875, -1.0625, 2.0**-10, 3 * 2.0**-10, 0.0048828125, 240.0, -464.0 / 2, 3.0625]
  row = np.zeros(width)
  row[:len(ties)] = ties
  row[group:2 * group] = 1e30                                  # huge: saturating scale / clamp
  row[2 * group] = 6.25                                        # e4m3 scale rounds down: y > 6 clamps
  row[2 * group + 1] = 1.0
  rows.append(row)
  # E4M3 group scales that are not powers of two (amax = 6 * s gives the scale s exactly in
  # the e4m3 mode): exact ties s * boundary, and neighbours one BF16 ulp away.
  bounds = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
  for s in (1.125, 1.375, 1.875, 0.0546875, 2.0**-9 * 1.625):
    row = np.zeros(width)
    for g, ties in enumerate((s * bounds, -s * bounds, s * bounds * (1 + 2.0**-7), s * bounds * (1 - 2.0**-8))):
      row[g * group] = 6 * s
      row[g * group + 1:g * group + 1 + len(ties)] = ties[:group - 1]
    rows.append(row)
  return np.stack(rows).astype(ml_dtypes.bfloat16)


def special_x(mode):
  rows = special_rows(mode)
  return rows[:, None, :] if mode == FP4_32 else rows


def assert_bitwise(actual, expected, name):
  a, e = bits(np.asarray(actual)), bits(np.asarray(expected))
  bad = np.nonzero(a != e)
  assert not bad[0].size, (f"{name}: {bad[0].size} of {a.size} elements differ, first at "
                           f"{tuple(int(i[0]) for i in bad)}: {np.asarray(actual)[bad][:4]} != "
                           f"{np.asarray(expected)[bad][:4]}")


def assert_raw_bits(actual, expected, name):
  """Bitwise with NaN payloads and signs included: the op writes one NaN pattern on every path."""
  a, e = np.asarray(actual).view(np.uint16), np.asarray(expected).view(np.uint16)
  bad = np.nonzero(a != e)
  assert not bad[0].size, (f"{name}: {bad[0].size} of {a.size} elements differ, first at "
                           f"{tuple(int(i[0]) for i in bad)}: {[hex(v) for v in a[bad][:4]]} != "
                           f"{[hex(v) for v in e[bad][:4]]}")


def run_jax(mode, x, cache, positions, implementation):
  return np.asarray(rope_qdq(jnp.asarray(x), jnp.asarray(cache), jnp.asarray(positions), **_kw(mode),
                             implementation=implementation))


# ------------------------------------------------------------------- the oracle itself


def _fma_triples(rng, n):
  """a (BF16 values), c, d (FP32) with d chosen to cancel a*c into midpoint and near-midpoint cases."""
  a = rng.standard_normal(n).astype(ml_dtypes.bfloat16).astype(np.float32)
  c = rng.uniform(-1, 1, n).astype(np.float32)
  prod = (a.astype(np.float64) * c).astype(np.float32)
  ulps = rng.integers(-3, 4, n).astype(np.float32)
  d = np.where(rng.random(n) < 0.5, -prod * np.float32(0.5) + ulps * np.spacing(prod),
               rng.standard_normal(n).astype(np.float32))
  d = np.where(rng.random(n) < 0.05, np.float32(0.0), d)
  d = np.where(rng.random(n) < 0.05, np.float32(-0.0), d).astype(np.float32)
  a[:8], c[:8], d[:8] = [0.0, -0.0, 1.0, -1.0, 0.0, -0.0, 1.0, -1.0], [1, 1, 0, -0.0, -1, -1, -0.0, 0], \
      [-0.0, -0.0, -0.0, -0.0, 0.0, -0.0, 0.0, 0.0]
  return a, c, d


def test_oracle_fma_matches_rational_definition():
  a, c, d = _fma_triples(np.random.default_rng(1), 3000)
  want = np.array([fma32_fraction(float(x), float(y), float(z)) for x, y, z in zip(a, c, d)], np.float32)
  assert_bitwise(fma32(a, c, d), want, "fma32")


def test_oracle_fma_nonfinite_and_overflow_match_rational_definition():
  """NaN, +-Inf, Inf * 0, Inf - Inf, and overflow at the FP32 rounding threshold 2**128 - 2**103
  (31 * 2**100 times 1082401 * 2**3 is exactly that threshold: a tie that goes to Inf, and a
  2**-100 on either side decides between Inf and the largest finite value)."""
  rng = np.random.default_rng(15)
  vals = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.5, 3.0e38, -3.4e38, 2.0**-140], np.float32)
  a, c, d = (vals[rng.integers(0, len(vals), 2000)] for _ in range(3))
  edge_a, edge_c = np.float32(31 * 2.0**100), np.float32(1082401 * 2.0**3)
  a[:4], c[:4], d[:4] = edge_a, edge_c, [0.0, 2.0**-100, -2.0**-100, -2.0**103]
  want = np.array([fma32_fraction(float(x), float(y), float(z)) for x, y, z in zip(a, c, d)], np.float32)
  assert [float(v) for v in want[:4]] == [np.inf, np.inf, float(np.finfo(np.float32).max), 2.0**128 - 2.0**104]
  assert_bitwise(fma32(a, c, d), want, "fma32 non-finite")


def test_reference_fma_matches_oracle():
  a, c, d = _fma_triples(np.random.default_rng(2), 200_000)
  got = jax.jit(reference._fma)(jnp.asarray(a), jnp.asarray(c), jnp.asarray(d))
  assert_bitwise(got, fma32(a, c, d), "reference._fma")


# ---------------------------------------------- bit-level building blocks of the reference


def _f32(bits_u32):
  return np.asarray(bits_u32, np.uint32).view(np.float32)


def _random_f32_patterns(rng, n):
  """Finite FP32 patterns of both signs: every exponent (subnormals and the top binade included),
  random mantissas, plus mantissas at and around the BF16 rounding point (ties, carries)."""
  sign = rng.integers(0, 2, n).astype(np.uint32) << 31
  exp = rng.integers(0, 255, n).astype(np.uint32) << 23
  man = rng.integers(0, 1 << 23, n).astype(np.uint32)
  special = np.array([0, 0x7FFF, 0x8000, 0x8001, 0x18000, 0x17FFF, 0x7F8000, 0x7FFFFF, 0x7F7FFF, 0x10000],
                     np.uint32)
  man[: n // 2] = special[rng.integers(0, len(special), n // 2)]
  return _f32(sign | exp | man)


def test_reference_bf16_rounding_on_bits_matches_ml_dtypes():
  """The integer RNE replacing ``astype(bf16)`` (a convert pair XLA:GPU deletes) is ml_dtypes' rounding."""
  v = _random_f32_patterns(np.random.default_rng(10), 200_000)
  got = jax.jit(reference._round_bf16_bits)(jnp.asarray(v.view(np.int32)))
  want = v.astype(ml_dtypes.bfloat16).astype(np.float32)
  assert_bitwise(_f32(np.asarray(got).view(np.uint32)), want, "_round_bf16_bits")


def test_reference_scale_down_on_bits_rounds_like_ieee():
  """``|v| * 2**-64`` on the bits == the IEEE product (exact in float64, then one RNE), subnormals included."""
  rng = np.random.default_rng(11)
  v = _random_f32_patterns(rng, 200_000)
  v = np.where(rng.random(v.size) < 0.7, np.abs(v) * np.float32(2.0**-60), v).astype(np.float32)  # near the edge
  got = jax.jit(lambda b: reference._scale_down_bits(b, jnp.int32(64)))(jnp.asarray(v.view(np.int32)))
  want = (np.abs(v).astype(np.float64) * 2.0**-64).astype(np.float32)
  assert_bitwise(_f32(np.asarray(got).view(np.uint32)), want, "_scale_down_bits")
  same = jax.jit(lambda b: reference._scale_down_bits(b, jnp.int32(0)))(jnp.asarray(v.view(np.int32)))
  assert_bitwise(_f32(np.asarray(same).view(np.uint32)), np.abs(v), "_scale_down_bits k=0")


def test_reference_scale_up_on_bits_is_exact():
  """``v * 2**64`` on the bits for every BF16 value below 2**-40, the subnormal ones included."""
  v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
  v = v[np.abs(v) < 2.0**-40]
  got = np.asarray(jax.jit(reference._scale_up)(jnp.asarray(v)))
  assert_bitwise(got, (v.astype(np.float64) * 2.0**64).astype(np.float32), "_scale_up")


def _primitives(jaxpr, found):
  for eqn in jaxpr.eqns:
    found.append(eqn)
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          _primitives(getattr(inner, "jaxpr", inner), found)
  return found


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_reference_graph_has_no_fragile_float_ops(mode):
  """What XLA:GPU rewrites or approximates is absent from the reference's graph.

  - float -> float converts: ``f32 -> bf16 -> f32`` pairs are deleted by XLA:GPU's
    excess-precision pass, so a BF16 rounding done with converts silently vanishes
    there (the cause of the reference/oracle mismatches seen on an H200);
  - division (rewritten into a reciprocal multiply) and transcendental or rounding
    instructions such as log2/exp2/pow/ceil (approximate or fast-math sensitive).
  """
  m = reference.MODES[mode]
  x = jnp.zeros((4, m.width), jnp.bfloat16)
  jaxpr = jax.make_jaxpr(lambda x, c, p: reference.rope_qdq(x, c, p, m))(
      x, jnp.zeros((5, 64), jnp.float32), jnp.zeros((4,), jnp.int32))
  forbidden = {"div", "rem", "exp", "exp2", "log", "log1p", "pow", "integer_pow", "sqrt", "rsqrt", "cbrt", "tanh",
               "logistic", "ceil", "floor", "round", "nextafter", "reduce_precision"}
  bad = []
  for eqn in _primitives(jaxpr.jaxpr, []):
    name = eqn.primitive.name
    if name in forbidden:
      bad.append(name)
    elif name == "convert_element_type":
      src, dst = eqn.invars[0].aval.dtype, eqn.params["new_dtype"]
      if jnp.issubdtype(src, jnp.floating) and jnp.issubdtype(dst, jnp.floating) and src != dst:
        bad.append(f"convert {src}->{dst}")
  assert not bad, f"fragile ops in the reference graph: {sorted(set(bad))}"


def subnormal_tail_case(mode):
  """BF16 subnormals and values near 2**-126 in the rotated tail (the 2**64 rescaling path).

  Rows of the upper half stay below 2**-124, so fp4/UE8M0 groups sit at the floor scale
  2**-126 and the subnormal rotated values decide their codes.
  """
  rng = np.random.default_rng(12)
  width = 128 if mode == FP4_32 else 512
  rows = np.zeros((64, width))
  top = np.where(np.arange(64) < 32, -118.0, -124.0)[:, None]
  rows[:, width - 64:] = 2.0 ** rng.uniform(-134, top, (64, 64)) * rng.choice([-1.0, 1.0], (64, 64))
  rows[::7, width - 64::2] = 0.0
  x = rows.astype(ml_dtypes.bfloat16)
  x = x[:, None, :] if mode == FP4_32 else x
  cache = make_cache(rng)
  return x, cache, make_positions(rng, mode, x.shape)


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_reference_subnormal_tail(mode):
  x, cache, pos = subnormal_tail_case(mode)
  assert_bitwise(run_jax(mode, x, cache, pos, "xla"), rope_qdq_oracle(x, cache, pos, *mode), "xla subnormal tail")


# ------------------------------------------------------------------------ reference


@pytest.mark.parametrize("mode,shape", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_reference_bitwise(mode, shape, magnitude):
  x, cache, pos = random_case(mode, shape, magnitude)
  assert_bitwise(run_jax(mode, x, cache, pos, "xla"), rope_qdq_oracle(x, cache, pos, *mode), "xla")


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_reference_special_rows(mode):
  rng = np.random.default_rng(3)
  x, cache = special_x(mode), make_cache(rng)
  pos = make_positions(rng, mode, x.shape)
  assert_bitwise(run_jax(mode, x, cache, pos, "xla"), rope_qdq_oracle(x, cache, pos, *mode), "xla special")


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_reference_int64_positions_and_shapes(mode):
  rng = np.random.default_rng(4)
  shape = (6, 4, 128) if mode == FP4_32 else (3, 4, 512)
  x, cache = make_x(rng, shape, 1.0), make_cache(rng)
  pos = make_positions(rng, mode, shape, np.int64)
  want = rope_qdq_oracle(x, cache, pos, *mode)
  with jax.enable_x64(True):
    assert_bitwise(run_jax(mode, x, cache, pos, "xla"), want, "int64 positions")
  if mode != FP4_32:  # positions shaped like x.shape[:-1] are accepted too
    assert_bitwise(run_jax(mode, x, cache, pos.reshape(shape[:-1]), "xla"), want, "nd positions")


def signed_zero_case(mode):
  """Rotations whose exact result is zero: zero pairs of both signs at sin = +0 and sin = -0."""
  width = 128 if mode == FP4_32 else 512
  x = np.zeros((8, width))
  tail = x[:, width - 64:]
  tail[:, 0::2] = np.where(np.arange(32) % 2, -0.0, 0.0)
  tail[:, 1::2] = np.array([1.0, -1.0, 0.0, -0.0] * 8)
  x[1::2] = -x[1::2]
  cache = np.concatenate([np.ones((2, 32)), np.zeros((2, 32))], 1).astype(np.float32)
  cache[1, 32:] = -0.0
  cache[1, :16] = -1.0
  pos = np.array([0, 0, 1, 1, 0, 1, 1, 0])
  x = x.astype(ml_dtypes.bfloat16)
  if mode == FP4_32:
    return x[:, None, :], cache, pos.astype(np.int32)
  return x, cache, pos.astype(np.int32)


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_reference_signed_zero_rotation(mode):
  x, cache, pos = signed_zero_case(mode)
  assert_bitwise(run_jax(mode, x, cache, pos, "xla"), rope_qdq_oracle(x, cache, pos, *mode), "xla signed zeros")


# ------------------------------------------------------------------ non-finite inputs
# The rule (docs/NUMERICS.md, section 9.3): a NaN in a group (from x,
# from the cache row, or made by the rotation) makes the whole group the canonical NaN 0x7FC0;
# +-Inf counts as the largest finite FP32 value for the amax and quantizes to +-limit * scale
# (+-Inf in the UE8M0 modes, where that product overflows; +-2688 in the e4m3 mode).

_NAN_PATTERNS = (0xFFC1, 0x7F81, 0x7FFF, 0xFFFF)  # negative, signalling-like and all-ones NaN payloads


def nonfinite_cache():
  """[8, 64] fp32. 0: identity (sin = +0); 1: cos = sin = sqrt(1/2); 2, 3, 4: a real row with NaN
  cos[5], +Inf sin[9], -Inf cos[2]; 5: identity with NaN sin[30]; 6: a scaled cache (x1.5, pair 0
  at 45 degrees); 7: real."""
  c = make_cache(None, 8)
  c[0, :32], c[0, 32:] = 1.0, 0.0
  c[1] = np.sqrt(np.float32(0.5))
  c[2, 5] = np.nan
  c[3, 32 + 9] = np.inf
  c[4, 2] = -np.inf
  c[5, :32], c[5, 32:] = 1.0, 0.0
  c[5, 32 + 30] = np.nan
  c[6] *= 1.5
  c[6, [0, 32]] = 1.5 * np.sqrt(np.float32(0.5))  # pair 0 at 45 degrees, scaled: cos = sin > 1
  return c


def nonfinite_case(mode):
  """Rows with NaN/+-Inf in the head, in rotated pairs and in the used cache row, rotations that
  make NaN (Inf * 0, Inf - Inf) or overflow to Inf, and huge finite values beside Inf."""
  width, group = (128, 32) if mode == FP4_32 else (512, mode[1])
  t = width - 64  # first rotated channel; pair p is channels t + 2p, t + 2p + 1
  inf, nan, big = np.inf, np.nan, 3.0e38
  scenarios = [
      (7, {3: nan}),                                   # NaN in the head: its group only
      (7, {3: inf, group + 5: -inf}),                  # +-Inf in two head groups
      (7, {0: 3.38e38, 1: inf, 2: -3.38e38, 3: -inf, 4: 1.0, 5: -0.0}),  # huge finite beside +-Inf
      (7, {t: nan}),                                   # NaN in a rotated a
      (7, {t + 3: inf}),                               # Inf in a rotated b
      (7, {t + 12: 1e-30, t + 13: -inf}),              # tiny partner of an Inf
      (0, {t + 2: inf}),                               # Inf * (sin = +0) is NaN: its pair's group
      (1, {t + 4: inf, t + 5: inf}),                   # real: Inf - Inf = NaN
      (1, {t + 6: -inf, t + 7: inf}),                  # imag: -Inf + Inf = NaN
      (1, {t + 8: big, t + 9: big}),                   # finite rotation overflowing to +Inf
      (1, {t + 10: big, t + 11: -big}),                # ... and to -Inf
      (6, {t + 12: 2.5e38, t + 13: -2.5e38}),          # products near the FP32 range with a scaled cache
      (6, {t + 2: 3.38e38, t + 3: 3.38e38}),           # b * sin (-1.47 here) overflows: real = +Inf
      (6, {t: 3.3e38, t + 1: 3.3e38}),                 # b * sin overflows though a*cos - b*sin is 0: -Inf
      (2, {}),                                         # NaN cos[5] in the used row
      (3, {}),                                         # +Inf sin[9]
      (4, {t + 4: 0.0, t + 5: -0.0}),                  # -Inf cos[2] times zeros: NaN
      (5, {}),                                         # NaN sin[30] on an identity row
      (7, {c: inf for c in range(width)}),             # a row of +Inf
  ]
  rng = np.random.default_rng(13)
  x = rng.standard_normal((len(scenarios) + len(_NAN_PATTERNS), width))
  for r, (_, values) in enumerate(scenarios):
    for c, v in values.items():
      x[r, c] = v
  x = x.astype(ml_dtypes.bfloat16)
  u = x.view(np.uint16)
  for i, pattern in enumerate(_NAN_PATTERNS):  # NaN bit patterns other than the canonical one
    r = len(scenarios) + i
    u[r, (i * 37) % width] = pattern
    u[r, t + (i * 11) % 64] = pattern
  pos = np.array([p for p, _ in scenarios] + [7] * len(_NAN_PATTERNS), np.int32)
  x = x[:, None, :] if mode == FP4_32 else x
  return x, nonfinite_cache(), pos


def _group_view(out, mode):
  """Output bits [rows, groups, group] (uint16)."""
  group = mode[1]
  return np.asarray(out).view(np.uint16).reshape(-1, (128 if mode == FP4_32 else 512) // group, group)


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_nonfinite_rule_explicit_values(mode):
  """The rule on a row whose values are worked out by hand (not by the oracle).

  Group 0 holds +Inf, -Inf, 1.0, -0.0 and 2**-20; group 1 holds a NaN; the rest are zeros.
  The Inf group's scale is the one of the largest finite amax: 2**126 (fp4/UE8M0), 2**120
  (fp8/UE8M0) or 448 (E4M3), so 1.0 and 2**-20 quantize to +0, -0.0 stays -0, and +-Inf gives
  +-limit * scale: +-Inf when that overflows FP32 (UE8M0), +-6 * 448 = +-2688 (E4M3).
  """
  width, group = (128, 32) if mode == FP4_32 else (512, mode[1])
  row = np.zeros(width)
  row[:5] = [np.inf, -np.inf, 1.0, -0.0, 2.0**-20]
  row[group + 3] = np.nan
  x = row[None].astype(ml_dtypes.bfloat16)
  x = x[:, None, :] if mode == FP4_32 else x
  cache, pos = make_cache(None, 3), np.zeros(1, np.int32)
  out = _group_view(run_jax(mode, x, cache, pos, "xla"), mode)[0]
  inf_out = 0x7F80 if mode[2] == "ue8m0" else int(np.array(2688.0, ml_dtypes.bfloat16).view(np.uint16))
  assert [hex(v) for v in out[0, :5]] == [hex(v) for v in (inf_out, inf_out | 0x8000, 0, 0x8000, 0)]
  assert (out[1] == NAN_BF16).all(), "a NaN must make its whole group the canonical NaN"
  assert not np.isnan(np.asarray(out[[0] + list(range(2, len(out)))]).view(ml_dtypes.bfloat16).astype(
      np.float32)).any(), "a NaN must not spread to other groups"


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_reference_nonfinite(mode):
  x, cache, pos = nonfinite_case(mode)
  want = rope_qdq_oracle(x, cache, pos, *mode)
  w = want.astype(np.float32)
  assert np.isnan(w).any() and (np.isinf(w).any() if mode[2] == "ue8m0" else (np.abs(w) == 2688).any())
  assert_raw_bits(run_jax(mode, x, cache, pos, "xla"), want, "xla non-finite")


_BIG_IDS = np.array([2**31, 2**40, -1, -2**40, 2**31 - 1, -2**31, 3, 0], np.int64)


def big_ids_case(mode):
  """Ids far outside [0, P), as int64 (2**31 and 2**40 must clamp to P - 1, negative ones to 0)
  with the ids they must act as; cache rows all differ, so a wrong row shows."""
  rng = np.random.default_rng(14)
  x = make_x(rng, (len(_BIG_IDS), 2, 128) if mode == FP4_32 else (len(_BIG_IDS), 512), 1.0)
  return x, make_cache(rng), _BIG_IDS, np.clip(_BIG_IDS, 0, P - 1).astype(np.int32)


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_reference_int64_ids_outside_range_clamp(mode):
  x, cache, ids, clamped = big_ids_case(mode)
  want = rope_qdq_oracle(x, cache, clamped, *mode)
  with jax.enable_x64(True):  # int64 on device: clamped before any narrowing
    assert_bitwise(run_jax(mode, x, cache, ids, "xla"), want, "int64 ids, x64")
  # Without x64, JAX would narrow an int64 NumPy array to int32 (wrapping 2**32 + 3 to 3): the
  # op clamps NumPy ids on the host first.
  host = lambda ids: np.asarray(rope_qdq(jnp.asarray(x), jnp.asarray(cache), ids, **_kw(mode), implementation="xla"))
  assert_bitwise(host(ids), want, "int64 NumPy ids")
  wrapping = np.full(len(ids), 2**32 + 3, np.int64)
  assert_bitwise(host(wrapping), rope_qdq_oracle(x, cache, np.full(len(ids), P - 1), *mode),
                 "2**32 + 3 clamps, never wraps")


@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_torch_cpu_int64_ids_outside_range_clamp(mode):
  """The torch shim's CPU path hands int64 ids to JAX, which without x64 would wrap them."""
  torch = pytest.importorskip("torch")
  import jqat.torch as jt

  x, cache, ids, clamped = big_ids_case(mode)
  xt = torch.from_numpy(np.ascontiguousarray(x).view(np.int16).copy()).view(torch.bfloat16)
  jt.rope_qdq_inplace(xt, torch.from_numpy(cache), torch.from_numpy(ids), **_kw(mode))
  assert_bitwise(xt.view(torch.int16).numpy().view(ml_dtypes.bfloat16), rope_qdq_oracle(x, cache, clamped, *mode),
                 "torch CPU int64 ids")


def _nonfinite_properties(run, mode, x, cache, pos):
  """NaN containment per group, and equality with the oracle, of ``run(mode, x, cache, pos)``.

  Independent of the oracle: a group whose inputs (its channels of x, and for a rotated group
  the cache entries of its pairs in the row its id selects) hold a NaN is NaN throughout;
  a group whose inputs are all finite holds no NaN (the cache is at most 1 in magnitude, so
  nothing but an input can make Inf * 0 or Inf - Inf); every group is all-NaN or NaN-free.
  """
  out = run(mode, x, cache, pos)
  width, group = (128, 32) if mode == FP4_32 else (512, mode[1])
  xf = np.asarray(x).reshape(-1, width).astype(np.float32)
  ids = np.asarray(pos).reshape(-1).astype(np.int64)
  if mode == FP4_32:
    ids = np.repeat(ids, x.shape[1])
  rows = np.clip(ids, 0, cache.shape[0] - 1)
  # Per channel: a NaN among its inputs, a non-finite one (a rotated channel reads its pair's cos and sin).
  # Flags, not sums: x = -Inf plus an Inf cache entry would make a NaN that no input holds.
  cos, sin = cache[rows, :32], cache[rows, 32:]
  nan_in, bad_in = np.isnan(xf), ~np.isfinite(xf)
  nan_in[:, width - 64:] |= np.repeat(np.isnan(cos) | np.isnan(sin), 2, axis=1)
  bad_in[:, width - 64:] |= np.repeat(~(np.isfinite(cos) & np.isfinite(sin)), 2, axis=1)
  must_nan = nan_in.reshape(len(xf), -1, group).any(-1)
  finite_in = ~bad_in.reshape(len(xf), -1, group).any(-1)
  got = _group_view(out, mode)
  nan_out = np.isnan(got.view(ml_dtypes.bfloat16).astype(np.float32))
  assert (nan_out.all(-1) | ~nan_out.any(-1)).all(), "a group is partly NaN"
  assert (got[nan_out] == NAN_BF16).all(), "a NaN other than the canonical 0x7FC0"
  assert nan_out.all(-1)[must_nan].all(), "a group with a NaN input is not NaN"
  assert not nan_out.any(-1)[finite_in].any(), "a NaN in a group whose inputs are finite"
  assert_raw_bits(out, rope_qdq_oracle(x, cache, pos, *mode), "vs oracle")


_PROPERTY_SHAPES = {FP4_32: (3, 3, 128), FP8_32: (2, 2, 512), FP4_16: (3, 512)}  # one compile per mode
_SPECIALS = (np.nan, np.inf, -np.inf)


@st.composite
def nonfinite_inputs(draw):
  """A mode, and x, cache (|values| <= 1) and ids with NaN/+-Inf dropped into random elements,
  ids outside [0, P) included. The values come from a NumPy generator seeded by hypothesis."""
  mode = draw(st.sampled_from([FP4_32, FP8_32, FP4_16]))
  shape = _PROPERTY_SHAPES[mode]
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  magnitude = draw(st.sampled_from([1e-38, 1e-3, 1.0, 1e37]))
  x = make_x(rng, shape, magnitude).astype(np.float32)
  flat = x.reshape(-1)
  hits = rng.integers(0, flat.size, draw(st.integers(0, 6)))
  flat[hits] = rng.choice(_SPECIALS, hits.size)
  cache = rng.uniform(-1, 1, (5, 64)).astype(np.float32)
  hits = rng.integers(0, cache.size, draw(st.integers(0, 3)))
  cache.reshape(-1)[hits] = rng.choice(_SPECIALS, hits.size)
  ids = rng.integers(-3, 5 + 3 if draw(st.booleans()) else 5, n_positions(mode, shape)).astype(np.int32)
  return mode, x.astype(ml_dtypes.bfloat16), cache, ids


@settings(deadline=None, max_examples=50, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(nonfinite_inputs())
def test_reference_nonfinite_properties(case):
  _nonfinite_properties(lambda *a: run_jax(*a, "xla"), *case)


def test_reference_under_jit_and_default_dispatch():
  rng = np.random.default_rng(5)
  x, cache = make_x(rng, (9, 2, 128), 1.0), make_cache(rng)
  pos = make_positions(rng, FP4_32, x.shape)
  f = jax.jit(lambda x, c, p: rope_qdq(x, c, p))
  want = rope_qdq_oracle(x, cache, pos, *FP4_32)
  assert_bitwise(f(jnp.asarray(x), jnp.asarray(cache), jnp.asarray(pos)), want, "jit default")


def test_empty_x():
  x = jnp.zeros((0, 4, 128), jnp.bfloat16)
  out = rope_qdq(x, jnp.zeros((3, 64), jnp.float32), jnp.zeros((0,), jnp.int32))
  assert out.shape == x.shape and out.dtype == jnp.bfloat16


# ------------------------------------------------------------------ validation (docs/API.md, section 3)

_X4 = jnp.zeros((2, 3, 128), jnp.bfloat16)
_X8 = jnp.zeros((2, 3, 512), jnp.bfloat16)
_C = jnp.zeros((5, 64), jnp.float32)
_P2 = jnp.zeros((2,), jnp.int32)
_P6 = jnp.zeros((6,), jnp.int32)


@pytest.mark.parametrize("args,kw,exc,words", [
    ((_X4, _C, _P2), dict(quantization="int4"), ValueError, ["quantization", "int4"]),
    ((_X4, _C, _P2), dict(scale_format="e8m0"), ValueError, ["scale_format", "e8m0"]),
    ((_X4, _C, _P2), dict(group_size=64), ValueError, ["group_size", "64"]),
    ((_X4, _C, _P2), dict(group_size="32"), TypeError, ["group_size", "int", "str", "'32'"]),
    ((_X4, _C, _P2), dict(group_size=True), TypeError, ["group_size", "int", "bool", "True"]),
    ((_X4, _C, _P2), dict(group_size=32.0), TypeError, ["group_size", "int", "float", "32.0"]),
    ((_X4, _C, _P2), dict(quantization=4), TypeError, ["quantization", "str", "int", "4"]),
    ((_X4, _C, _P2), dict(quantization=b"fp4"), TypeError, ["quantization", "str", "bytes"]),
    ((_X4, _C, _P2), dict(scale_format=None), TypeError, ["scale_format", "str", "NoneType"]),
    ((_X4, _C, _P2), dict(scale_format=np.array("ue8m0")), TypeError, ["scale_format", "str", "ndarray"]),
    ((_X4, _C, _P2), dict(implementation=1), TypeError, ["implementation", "int", "1"]),
    ((_X4, _C, _P2), dict(implementation=["xla"]), TypeError, ["implementation", "list"]),
    ((_X8, _C, _P6), dict(quantization="fp8", group_size=16, scale_format="ue8m0"), ValueError,
     ["quantization, group_size and scale_format", "group_size=16"]),
    ((_X4.astype(jnp.float16), _C, _P2), {}, TypeError, ["x", "bfloat16", "float16"]),
    ((jnp.zeros((2, 3, 64), jnp.bfloat16), _C, _P2), {}, ValueError, ["x", "[N, H, 128]", "(2, 3, 64)"]),
    ((jnp.zeros((6, 128), jnp.bfloat16), _C, _P6), {}, ValueError, ["x", "[N, H, 128]", "(6, 128)"]),
    ((jnp.zeros((512,), jnp.bfloat16), _C, _P2), dict(quantization="fp8"), ValueError, ["x", "rank >= 2", "(512,)"]),
    ((jnp.zeros((2, 3, 256), jnp.bfloat16), _C, _P6), dict(quantization="fp8"), ValueError,
     ["x", "512", "(2, 3, 256)"]),
    ((_X4, _C.astype(jnp.bfloat16), _P2), {}, TypeError, ["cache", "float32", "bfloat16"]),
    ((_X4, jnp.zeros((5, 32), jnp.float32), _P2), {}, ValueError, ["cache", "[P, 64]", "(5, 32)"]),
    ((_X4, jnp.zeros((0, 64), jnp.float32), _P2), {}, ValueError, ["cache", "P >= 1", "(0, 64)"]),
    ((_X4, _C, _P2.astype(jnp.float32)), {}, TypeError, ["positions", "int32 or int64", "float32"]),
    ((_X4, _C, _P6), {}, ValueError, ["positions", "(2,)", "(6,)"]),
    ((_X8, _C, _P2), dict(quantization="fp8"), ValueError, ["positions", "(2, 3) or (6,)", "(2,)"]),
    ((_X4, _C, _P2), dict(implementation="cuda"), ValueError, ["implementation", "cuda"]),
    (([1.0], _C, _P2), {}, TypeError, ["x", "array", "list"]),
])
def test_validation_names_argument(args, kw, exc, words):
  with pytest.raises(exc) as info:
    rope_qdq(*args, **kw)
  for w in words:
    assert w in str(info.value), f"{w!r} not in {str(info.value)!r}"


@pytest.mark.skipif(jax.devices()[0].platform == "gpu", reason="checks the CPU refusal")
def test_triton_requested_without_gpu_raises():
  with pytest.raises(RuntimeError, match="implementation='triton' cannot run here"):
    rope_qdq(_X4, _C, _P2, implementation="triton")


# --------------------------------------------------- the kernel under the Triton interpreter


def test_kernel_under_triton_interpreter():
  """Runs the ``interpreter_inner`` tests below in a process with TRITON_INTERPRET=1."""
  pytest.importorskip("torch")
  if INTERPRET:
    pytest.skip("already inside the interpreter run")
  env = dict(os.environ, TRITON_INTERPRET="1", JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "interpreter_inner",
                         os.path.abspath(__file__)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-2000:]


def _interpreter_kernel():
  """The kernel module imported in interpreter mode, with the interpreter's FMA and BF16 load made the GPU's.

  The interpreter evaluates ``tl.fma`` as ``x * y + z`` in NumPy FP32 (two roundings);
  the GPU instruction rounds once, so the builder gets the oracle's exact FMA. Its
  BF16 -> FP32 cast flushes subnormals to zero (a BF16 ``2**-130`` loads as 0), while
  ``cvt.f32.bf16`` is exact: it is given the GPU semantics on the bits. (The kernel
  rounds to BF16 on the bits without ``HW`` and stores by truncating bits, so no
  FP32 -> BF16 cast runs here.)
  """
  import triton.language as tl
  from triton.runtime import interpreter

  from jqat.kernels_triton import rope_qdq as kernel

  def create_fma(self, x, y, z):
    return interpreter.TensorHandle(fma32(x.data, y.data, z.data), z.dtype.scalar)

  builder = interpreter.InterpreterBuilder
  cast_impl = builder.cast_impl

  def cast_bf16_exactly(self, src, dst_type):
    src_t, dst_t = src.dtype.scalar, dst_type.scalar
    if src_t == tl.bfloat16 and dst_t == tl.float32:
      data = (np.asarray(src.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
      return interpreter.TensorHandle(data, dst_t)
    return cast_impl(self, src, dst_type)

  builder.create_fma = create_fma
  builder.cast_impl = cast_bf16_exactly
  return kernel


def _launch_interpreted(mode, x, cache, pos, out=None, block_r=None):
  """Launches the kernel on torch CPU tensors; in place unless ``out`` is given. Returns the bf16 result."""
  import torch

  kernel = _interpreter_kernel()
  m = reference.MODES[mode]
  xt = torch.from_numpy(np.ascontiguousarray(x).view(np.int16).copy()).view(torch.bfloat16)
  out_t = xt if out is None else torch.from_numpy(out.view(np.int16).copy()).view(torch.bfloat16)
  n_rows = xt.numel() // m.width
  config = kernel.launch_config(m.width, hw_e4m3=False)  # the interpreter has no hardware conversions
  config.pop("num_warps")
  if block_r is not None:
    config["BLOCK_R"] = block_r
  heads = x.shape[1] if m.per_token else 1
  kernel.rope_qdq_kernel[(-(-n_rows // config["BLOCK_R"]),)](
      xt, torch.from_numpy(cache), torch.from_numpy(np.ascontiguousarray(pos).reshape(-1)), n_rows, cache.shape[0],
      heads, out_t, D=m.width, GROUP=m.group, FP8=m.fp8, E4M3_SCALE=m.e4m3_scale, AMAX_FLOOR=m.floor, **config)
  return out_t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).reshape(x.shape)


_INTERP_SHAPES = [(FP4_32, (17, 3, 128)), (FP8_32, (3, 7, 512)), (FP4_16, (19, 512))]


@pytest.mark.skipif(not INTERPRET, reason="runs inside test_kernel_under_triton_interpreter")
@pytest.mark.parametrize("mode,shape", _INTERP_SHAPES, ids=str)
@pytest.mark.parametrize("magnitude", MAGNITUDES)
@pytest.mark.parametrize("pos_dtype", [np.int32, np.int64], ids=["int32", "int64"])
def test_interpreter_inner_bitwise(mode, shape, magnitude, pos_dtype):
  x, cache, pos = random_case(mode, shape, magnitude, pos_dtype)
  assert_bitwise(_launch_interpreted(mode, x, cache, pos), rope_qdq_oracle(x, cache, pos, *mode), "kernel")


@pytest.mark.skipif(not INTERPRET, reason="runs inside test_kernel_under_triton_interpreter")
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
@pytest.mark.parametrize("block_r", [None, 1, 4], ids=["default", "r1", "r4"])
def test_interpreter_inner_signed_zero_rotation(mode, block_r):
  x, cache, pos = signed_zero_case(mode)
  assert_bitwise(_launch_interpreted(mode, x, cache, pos, block_r=block_r), rope_qdq_oracle(x, cache, pos, *mode),
                 "kernel signed zeros")


@pytest.mark.skipif(not INTERPRET, reason="runs inside test_kernel_under_triton_interpreter")
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_interpreter_inner_subnormal_tail(mode):
  x, cache, pos = subnormal_tail_case(mode)
  assert_bitwise(_launch_interpreted(mode, x, cache, pos), rope_qdq_oracle(x, cache, pos, *mode),
                 "kernel subnormal tail")


@pytest.mark.skipif(not INTERPRET, reason="runs inside test_kernel_under_triton_interpreter")
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_interpreter_inner_special_rows_out_of_place_poisoned(mode):
  """Out of place into a NaN-poisoned buffer: every element must be written, bit-exact."""
  rng = np.random.default_rng(6)
  x, cache = special_x(mode), make_cache(rng)
  pos = make_positions(rng, mode, x.shape)
  poisoned = np.full(x.shape, np.nan, ml_dtypes.bfloat16)
  assert_bitwise(_launch_interpreted(mode, x, cache, pos, out=poisoned), rope_qdq_oracle(x, cache, pos, *mode),
                 "kernel special")


@pytest.mark.skipif(not INTERPRET, reason="runs inside test_kernel_under_triton_interpreter")
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
@pytest.mark.parametrize("block_r", [None, 1], ids=["default", "r1"])
def test_interpreter_inner_nonfinite(mode, block_r):
  x, cache, pos = nonfinite_case(mode)
  assert_raw_bits(_launch_interpreted(mode, x, cache, pos, block_r=block_r), rope_qdq_oracle(x, cache, pos, *mode),
                  "kernel non-finite")


@pytest.mark.skipif(not INTERPRET, reason="runs inside test_kernel_under_triton_interpreter")
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_interpreter_inner_int64_ids_outside_range_clamp(mode):
  x, cache, ids, clamped = big_ids_case(mode)
  assert_bitwise(_launch_interpreted(mode, x, cache, ids), rope_qdq_oracle(x, cache, clamped, *mode), "kernel ids")


@pytest.mark.skipif(not INTERPRET, reason="runs inside test_kernel_under_triton_interpreter")
@settings(deadline=None, max_examples=25, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(nonfinite_inputs())
def test_interpreter_inner_nonfinite_properties(case):
  _nonfinite_properties(_launch_interpreted, *case)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("mode,shape", SHAPES + [(FP8_32, (4097, 512)), (FP4_32, (1000, 4, 128))], ids=str)
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_triton_bitwise(mode, shape, magnitude):
  x, cache, pos = random_case(mode, shape, magnitude)
  assert_bitwise(run_jax(mode, x, cache, pos, "triton"), rope_qdq_oracle(x, cache, pos, *mode), "triton")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_triton_special_rows_and_int64(mode):
  rng = np.random.default_rng(7)
  x, cache = special_x(mode), make_cache(rng)
  pos = make_positions(rng, mode, x.shape)
  want = rope_qdq_oracle(x, cache, pos, *mode)
  assert_bitwise(run_jax(mode, x, cache, pos, "triton"), want, "triton special")
  with jax.enable_x64(True):
    assert_bitwise(run_jax(mode, x, cache, pos.astype(np.int64), "triton"), want, "triton int64")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_triton_signed_zero_rotation(mode):
  x, cache, pos = signed_zero_case(mode)
  assert_bitwise(run_jax(mode, x, cache, pos, "triton"), rope_qdq_oracle(x, cache, pos, *mode), "triton signed zeros")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
def test_triton_donated_x_is_updated_in_place(mode):
  rng = np.random.default_rng(8)
  shape = (64, 4, 128) if mode == FP4_32 else (33, 512)
  x_np, cache = make_x(rng, shape, 1.0), make_cache(rng)
  pos = make_positions(rng, mode, shape)
  f = jax.jit(lambda x, c, p: rope_qdq(x, c, p, **_kw(mode), implementation="triton"), donate_argnums=0)
  x = jnp.asarray(x_np)
  pointer = x.unsafe_buffer_pointer()
  out = f(x, jnp.asarray(cache), jnp.asarray(pos))
  out.block_until_ready()
  assert x.is_deleted(), "x was not donated"
  assert out.unsafe_buffer_pointer() == pointer, "the output does not reuse x's buffer"
  assert_bitwise(np.asarray(out), rope_qdq_oracle(x_np, cache, pos, *mode), "donated")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
@pytest.mark.parametrize("implementation", ["triton", "xla"])
def test_gpu_subnormal_tail(mode, implementation):
  x, cache, pos = subnormal_tail_case(mode)
  assert_bitwise(run_jax(mode, x, cache, pos, implementation), rope_qdq_oracle(x, cache, pos, *mode),
                 f"{implementation} subnormal tail")


@pytest.mark.gpu
def test_triton_matches_reference_on_gpu():
  """The XLA reference compiled for the GPU (no flush to zero there) agrees with the kernel."""
  rng = np.random.default_rng(9)
  for mode, shape in SHAPES:
    x, cache = make_x(rng, shape, 1.0), make_cache(rng)
    pos = make_positions(rng, mode, shape)
    assert_bitwise(run_jax(mode, x, cache, pos, "triton"), run_jax(mode, x, cache, pos, "xla"), f"{mode} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
@pytest.mark.parametrize("implementation", ["triton", "xla"])
def test_gpu_nonfinite(mode, implementation):
  """The same bits as the oracle, NaN payloads included (the kernel stores BF16 by truncating
  FP32 bits: cvt.rn.bf16.f32 would write its own canonical NaN 0x7FFF)."""
  x, cache, pos = nonfinite_case(mode)
  assert_raw_bits(run_jax(mode, x, cache, pos, implementation), rope_qdq_oracle(x, cache, pos, *mode),
                  f"{implementation} non-finite")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [FP4_32, FP8_32, FP4_16], ids=str)
@pytest.mark.parametrize("implementation", ["triton", "xla"])
def test_gpu_int64_ids_outside_range_clamp(mode, implementation):
  x, cache, ids, clamped = big_ids_case(mode)
  with jax.enable_x64(True):
    assert_bitwise(run_jax(mode, x, cache, ids, implementation), rope_qdq_oracle(x, cache, clamped, *mode),
                   f"{implementation} int64 ids")


@pytest.mark.gpu
@settings(deadline=None, max_examples=50, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(nonfinite_inputs())
def test_triton_nonfinite_properties(case):
  _nonfinite_properties(lambda *a: run_jax(*a, "triton"), *case)
