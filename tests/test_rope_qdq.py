"""Tail RoPE + microscaled QDQ (SPEC section 4): bitwise against the NumPy oracle, and validation (section 6).

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

from oracle import bits
from oracle_rope import MODES, fma32, fma32_fraction, rope_qdq_oracle

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
                           f"{tuple(int(i[0]) for i in bad)}: {np.asarray(actual)[bad][:4]} != {np.asarray(expected)[bad][:4]}")


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


# ------------------------------------------------------------------ validation (SPEC 6)

_X4 = jnp.zeros((2, 3, 128), jnp.bfloat16)
_X8 = jnp.zeros((2, 3, 512), jnp.bfloat16)
_C = jnp.zeros((5, 64), jnp.float32)
_P2 = jnp.zeros((2,), jnp.int32)
_P6 = jnp.zeros((6,), jnp.int32)


@pytest.mark.parametrize("args,kw,exc,words", [
    ((_X4, _C, _P2), dict(quantization="int4"), ValueError, ["quantization", "int4"]),
    ((_X4, _C, _P2), dict(scale_format="e8m0"), ValueError, ["scale_format", "e8m0"]),
    ((_X4, _C, _P2), dict(group_size=64), ValueError, ["group_size", "64"]),
    ((_X8, _C, _P6), dict(quantization="fp8", group_size=16, scale_format="ue8m0"), ValueError,
     ["quantization, group_size and scale_format", "group_size=16"]),
    ((_X4.astype(jnp.float16), _C, _P2), {}, TypeError, ["x", "bfloat16", "float16"]),
    ((jnp.zeros((2, 3, 64), jnp.bfloat16), _C, _P2), {}, ValueError, ["x", "[N, H, 128]", "(2, 3, 64)"]),
    ((jnp.zeros((6, 128), jnp.bfloat16), _C, _P6), {}, ValueError, ["x", "[N, H, 128]", "(6, 128)"]),
    ((jnp.zeros((512,), jnp.bfloat16), _C, _P2), dict(quantization="fp8"), ValueError, ["x", "rank >= 2", "(512,)"]),
    ((jnp.zeros((2, 3, 256), jnp.bfloat16), _C, _P6), dict(quantization="fp8"), ValueError, ["x", "512", "(2, 3, 256)"]),
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
  """The kernel module imported in interpreter mode, with the interpreter's FMA and BF16 casts made the GPU's.

  The interpreter evaluates ``tl.fma`` as ``x * y + z`` in NumPy FP32 (two roundings);
  the GPU instruction rounds once, so the builder gets the oracle's exact FMA. Its
  BF16 <-> FP32 casts flush subnormals to zero (a BF16 ``2**-130`` loads as 0), while
  ``cvt.f32.bf16`` is exact and ``cvt.rn.bf16.f32`` rounds to nearest even with
  subnormals; both are given the GPU semantics on the bits.
  """
  import triton.language as tl
  from triton.runtime import interpreter

  from kernels_triton import rope_qdq as kernel

  def create_fma(self, x, y, z):
    return interpreter.TensorHandle(fma32(x.data, y.data, z.data), z.dtype.scalar)

  builder = interpreter.InterpreterBuilder
  cast_impl = builder.cast_impl

  def cast_bf16_exactly(self, src, dst_type):
    src_t, dst_t = src.dtype.scalar, dst_type.scalar
    if src_t == tl.bfloat16 and dst_t == tl.float32:
      data = (np.asarray(src.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
      return interpreter.TensorHandle(data, dst_t)
    if src_t == tl.float32 and dst_t == tl.bfloat16:  # finite values in this kernel
      data = np.asarray(src.data, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
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
