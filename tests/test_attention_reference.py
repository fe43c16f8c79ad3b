"""The pure-JAX QAT attention (the "xla" implementation) against float64 NumPy (docs/NUMERICS.md, 4-5)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, assert_reordered_equal
from oracle import attention_grad_oracle, attention_oracle

import jqat

# Bounds. Outputs and gradients are stored in BF16, whose round-to-nearest
# relative error is at most 2**-9 per element, so the Frobenius-relative error
# of a correctly computed BF16 result is at most 2**-9 ~ 2.0e-3. The gradients
# also round dS to BF16 before the matmuls (as the spec does, and the oracle
# too, from float64 values), and an FP32 probability can fall on the other side
# of an E2M1 boundary than its float64 twin. 2 * 2**-9 covers both; the
# measured errors sit well under it. lse is FP32 end to end: 1e-5.
OUT_BOUND = 2 * 2.0**-9
LSE_BOUND = 1e-5

SHAPES = [  # (B, Tq, Tk, N, K, D)
    (1, 1, 1, 1, 1, 64),
    (2, 17, 17, 4, 2, 64),
    (1, 40, 23, 4, 1, 32),
    (1, 23, 70, 2, 2, 128),
    (1, 64, 64, 8, 8, 16),
]
# Attn-QAT, plain BF16, and each switch off alone (the paper's ablations).
SWITCHES = [(True,) * 4, (False,) * 4] + [tuple(j != i for j in range(4)) for i in range(4)]


def _inputs(shape, seed, dtype=jnp.bfloat16):
  b, tq, tk, n, kh, d = shape
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (b, tq, n, d), jnp.float32).astype(dtype)
  k = jax.random.normal(ks[1], (b, tk, kh, d), jnp.float32).astype(dtype)
  v = jax.random.normal(ks[2], (b, tk, kh, d), jnp.float32).astype(dtype)
  do = jax.random.normal(ks[3], (b, tq, n, d), jnp.float32).astype(dtype)
  return q, k, v, do


def _switches(cfg):
  return dict(zip(["quantize_qkv", "quantize_p", "high_precision_delta", "quantize_p_backward"], cfg))


# One tile and many, both tile sizes, each mask on shapes of both kinds (Tq < Tk, Tq > Tk, square); the shape
# that has one tile at one size and five at the other runs both masks.
@pytest.mark.parametrize("shape, block_n, is_causal", [
    (SHAPES[0], 64, True), (SHAPES[1], 16, False), (SHAPES[2], 64, True), (SHAPES[3], 16, False),
    (SHAPES[3], 16, True), (SHAPES[3], 64, False), (SHAPES[4], 16, True)])
def test_forward_matches_float64(shape, is_causal, block_n):
  q, k, v, _ = _inputs(shape, seed=sum(shape) + block_n)
  scale = 1 / math.sqrt(shape[-1])
  out, out_hp, lse = jax.jit(jqat.attention_forward, static_argnames=("is_causal", "implementation", "block_n"))(
      q, k, v, is_causal=is_causal, implementation="xla", block_n=block_n)
  ref_o, ref_ohp, ref_lse = attention_oracle(q, k, v, scale=scale, is_causal=is_causal, block_n=block_n)
  assert out.dtype == q.dtype and lse.dtype == jnp.float32 and lse.shape == (shape[0], shape[3], shape[1])
  assert_close(out, ref_o, rel=OUT_BOUND, name="O")
  assert_close(out_hp, ref_ohp, rel=OUT_BOUND, name="O'")
  assert_close(lse, ref_lse, rel=LSE_BOUND, name="lse")


@pytest.mark.parametrize("cfg, is_causal", [(c, True) for c in SWITCHES] + [(SWITCHES[0], False), (SWITCHES[1], False)],
                         ids=lambda c: "".join("1" if s else "0" for s in c) if isinstance(c, tuple) else str(c))
def test_switches_forward_and_backward(cfg, is_causal):
  shape = (1, 33, 48, 4, 2, 32)
  sw = _switches(cfg)
  q, k, v, do = _inputs(shape, seed=3)
  scale = 0.3
  config = jqat.QATConfig(*cfg)
  # jax.grad through the custom VJP, in one program with the explicit forward (CI time: one compile per case).
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, scale=scale, is_causal=is_causal, implementation="xla",
                                                block_n=16, **sw).astype(jnp.float32) * do.astype(jnp.float32))
  (out, out_hp, lse), (dq, dk, dv) = jax.jit(lambda q, k, v: (
      jqat.attention_forward(q, k, v, scale=scale, is_causal=is_causal, implementation="xla", block_n=16,
                             config=config),
      jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))(q, k, v)
  ref_o, ref_ohp, ref_lse = attention_oracle(q, k, v, scale=scale, is_causal=is_causal, block_n=16,
                                             quantize_qkv=sw["quantize_qkv"], quantize_p=sw["quantize_p"])
  assert_close(out, ref_o, rel=OUT_BOUND, name="O")
  assert_close(out_hp, ref_ohp, rel=OUT_BOUND, name="O'")
  assert_close(lse, ref_lse, rel=LSE_BOUND, name="lse")

  # The gradients == float64 backward fed with the residual the switch selects.
  o_delta = out_hp if sw["high_precision_delta"] else out
  rdq, rdk, rdv = attention_grad_oracle(do, q, k, v, o_delta, lse, scale=scale, is_causal=is_causal,
                                        quantize_qkv=sw["quantize_qkv"],
                                        quantize_p_backward=sw["quantize_p_backward"])
  assert_close(dq, rdq, rel=OUT_BOUND, name="dQ")
  assert_close(dk, rdk, rel=OUT_BOUND, name="dK")
  assert_close(dv, rdv, rel=OUT_BOUND, name="dV")


@pytest.mark.parametrize("shape, is_causal", [(SHAPES[1], True), (SHAPES[2], False), (SHAPES[3], True)])
def test_explicit_backward_matches_float64(shape, is_causal):
  q, k, v, do = _inputs(shape, seed=11)
  scale = 1 / math.sqrt(shape[-1])
  _, out_hp, lse = jqat.attention_forward(q, k, v, is_causal=is_causal, implementation="xla")
  dq, dk, dv = jqat.attention_backward(do, q, k, v, out_hp, lse, is_causal=is_causal, implementation="xla")
  rdq, rdk, rdv = attention_grad_oracle(do, q, k, v, out_hp, lse, scale=scale, is_causal=is_causal)
  assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
  assert_close(dq, rdq, rel=OUT_BOUND, name="dQ")
  assert_close(dk, rdk, rel=OUT_BOUND, name="dK")
  assert_close(dv, rdv, rel=OUT_BOUND, name="dV")


def test_dv_uses_quantized_p_and_delta_uses_o_prime():
  """The switches change exactly the term they name, and by far more than the test bound."""
  shape = (1, 32, 32, 2, 2, 64)
  q, k, v, do = _inputs(shape, seed=5)
  q = q * 3  # sharper softmax: P far from uniform, so fq(P) differs clearly from P
  grads = {}
  variants = {"qat": {}, "no_pq": {"quantize_p_backward": False}, "no_oprime": {"high_precision_delta": False}}
  for name, sw in variants.items():
    loss = lambda q, k, v, sw=sw: jnp.sum(jqat.attention(q, k, v, implementation="xla", is_causal=True, **sw).astype(
        jnp.float32) * do.astype(jnp.float32))
    grads[name] = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  rel = lambda a, b: float(jnp.linalg.norm((a - b).astype(jnp.float32)) / jnp.linalg.norm(b.astype(jnp.float32)))
  # quantize_p_backward only moves dV.
  assert rel(grads["no_pq"][2], grads["qat"][2]) > 10 * OUT_BOUND
  assert rel(grads["no_pq"][0], grads["qat"][0]) == 0 and rel(grads["no_pq"][1], grads["qat"][1]) == 0
  # delta from O instead of O' moves dQ and dK but not dV.
  assert rel(grads["no_oprime"][0], grads["qat"][0]) > 10 * OUT_BOUND
  assert rel(grads["no_oprime"][2], grads["qat"][2]) == 0
  # And the QAT gradient matches the oracle only when it is fed O' (not O).
  out, out_hp, lse = jqat.attention_forward(q, k, v, is_causal=True, implementation="xla")
  _, _, rdv = attention_grad_oracle(do, q, k, v, out_hp, lse, scale=1 / 8, is_causal=True)
  _, _, rdv_plain = attention_grad_oracle(do, q, k, v, out_hp, lse, scale=1 / 8, is_causal=True,
                                          quantize_p_backward=False)
  assert_close(grads["qat"][2], rdv, rel=OUT_BOUND, name="dV")
  assert rel(jnp.asarray(rdv_plain), jnp.asarray(rdv)) > 10 * OUT_BOUND
  rdq_o, _, _ = attention_grad_oracle(do, q, k, v, out, lse, scale=1 / 8, is_causal=True)
  assert_close(grads["no_oprime"][0], rdq_o, rel=OUT_BOUND, name="dQ from O")


def test_all_switches_off_is_plain_attention():
  q, k, v, _ = _inputs((2, 30, 30, 4, 2, 64), seed=7)
  off = dict(quantize_qkv=False, quantize_p=False, high_precision_delta=False, quantize_p_backward=False)
  out = jqat.attention(q, k, v, is_causal=True, implementation="xla", **off)
  up = lambda t: jnp.repeat(t, 2, axis=2).astype(jnp.float32)
  ref = jax.nn.dot_product_attention(q.astype(jnp.float32), up(k), up(v), is_causal=True)
  assert_close(out, ref, rel=OUT_BOUND, name="O")


def test_rows_without_visible_keys():
  """Causal cross-attention with Tq > Tk leaves no row empty, but Tk = 0 tiles do not exist; a
  row sees nothing only through the mask, e.g. query 0 of a causal op sees key 0 only."""
  q, k, v, _ = _inputs((1, 5, 3, 1, 1, 16), seed=1)
  out, out_hp, lse = jqat.attention_forward(q, k, v, is_causal=True, implementation="xla")
  assert np.isfinite(np.asarray(lse)).all() and np.isfinite(np.asarray(out, np.float32)).all()


def test_transforms_jit_vmap_checkpoint_grad():
  q, k, v, do = _inputs((2, 20, 20, 4, 2, 32), seed=9)
  f = lambda q, k, v: jqat.attention(q, k, v, is_causal=True, implementation="xla")
  loss = lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
  # Eager, jit, jit+remat and vmap are differently compiled XLA programs: they agree up to
  # FP32 reduction order (never promised bitwise), while a BF16 rounding skipped by XLA's
  # excess-precision rewrites under jit would move most elements (every spec rounding is
  # explicit, reduce_precision).
  g_plain = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  g_jit = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  g_remat = jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2)))(q, k, v)
  for a, b, c in zip(g_plain, g_jit, g_remat):
    assert_reordered_equal(a, b, name="eager vs jit grad")
    assert_reordered_equal(b, c, name="jit vs jit+remat grad")
  # vmap over a leading axis equals the batched call.
  batched = jax.vmap(f)(q[:, None], k[:, None], v[:, None])[:, 0]
  assert_reordered_equal(batched, f(q, k, v), name="vmap vs batched")
  g_vmap = jax.jit(jax.vmap(jax.grad(lambda q, k, v, do: jnp.sum(f(q[None], k[None], v[None])[0].astype(jnp.float32)
                                                         * do.astype(jnp.float32)), argnums=0)))(q, k, v, do)
  assert_reordered_equal(g_vmap, g_jit[0], name="jit(vmap(grad)) vs jit(grad)")


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (((1, 4, 2, 64), (1, 4, 2, 64), (1, 4, 2, 64)), {}, None),
        (((4, 2, 64), (1, 4, 2, 64), (1, 4, 2, 64)), {}, "query must have rank 4"),
        (((1, 4, 2, 60), (1, 4, 2, 60), (1, 4, 2, 60)), {}, "multiple of 16"),
        (((1, 4, 3, 64), (1, 4, 2, 64), (1, 4, 2, 64)), {}, r"query heads \(3\) must be a multiple"),
        (((1, 4, 2, 64), (1, 5, 2, 64), (1, 4, 2, 64)), {}, "value must have the shape of key"),
        (((1, 4, 2, 64), (2, 4, 2, 64), (2, 4, 2, 64)), {}, "key batch"),
        (((1, 4, 2, 64), (1, 4, 2, 32), (1, 4, 2, 32)), {}, "key head dim"),
        (((1, 4, 2, 64), (1, 4, 2, 64), (1, 4, 2, 64)), {"block_n": 24}, "block_n"),
        (((1, 4, 2, 64), (1, 4, 2, 64), (1, 4, 2, 64)), {"implementation": "cuda"}, "implementation must be"),
    ],
)
def test_validation_names_the_argument(args, kwargs, match):
  q, k, v = (jnp.zeros(s, jnp.bfloat16) for s in args)
  if match is None:
    assert jqat.attention(q, k, v, implementation="xla").shape == q.shape
    return
  with pytest.raises((ValueError, TypeError), match=match):
    jqat.attention(q, k, v, **kwargs)


def test_dtype_validation_and_triton_request_without_gpu():
  q = jnp.zeros((1, 4, 2, 64), jnp.int8)
  with pytest.raises(TypeError, match="query must be bfloat16"):
    jqat.attention(q, q, q)
  x = jnp.zeros((1, 4, 2, 64), jnp.bfloat16)
  if jax.default_backend() == "cpu":
    with pytest.raises(RuntimeError, match="implementation='triton' cannot run here"):
      jqat.attention(x, x, x, implementation="triton")


@pytest.mark.parametrize("is_causal", [False, True])
def test_backward_tiling_only_reorders_dq_sums(is_causal):
  """block_k = 16 (five tiles, the last one partial) against one tile holding every key: dK and dV
  of a key come from its own tile either way, dQ differs by FP32 summation order only."""
  from jqat._src import attention_reference as reference

  q, k, v, do = _inputs((1, 40, 70, 4, 2, 32), seed=13)
  _, out_hp, lse = jqat.attention_forward(q, k, v, is_causal=is_causal, implementation="xla")
  run = lambda block_k: jax.jit(functools.partial(reference.backward, scale=0.2, is_causal=is_causal,
                                                  cfg=jqat.QATConfig(), block_k=block_k))(do, q, k, v, out_hp, lse)
  tiled, untiled = run(16), run(80)
  for name, a, b in zip(("dQ", "dK", "dV"), tiled, untiled):
    assert_reordered_equal(a, b, name=f"{name} tiled vs untiled")
  with pytest.raises(ValueError, match="block_k must be a positive multiple of 16, got 24"):
    run(24)


def test_backward_memory_is_linear_in_sequence_length():
  """The compiled grad holds O(T) temporaries: far below one FP32 [Tq, Tk] array at T = 4096, and
  doubling T doubles them (a [Tq, Tk] intermediate would quadruple)."""
  loss = lambda q, k, v: jqat.attention(q, k, v, is_causal=True, implementation="xla").astype(jnp.float32).sum()

  def temp_bytes(t):
    x = jax.ShapeDtypeStruct((1, t, 1, 64), jnp.bfloat16)
    analysis = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x).compile().memory_analysis()
    return analysis.temp_size_in_bytes

  t = 4096
  small, large = temp_bytes(t), temp_bytes(2 * t)
  assert small < t * t * 4 / 2, f"{small} temp bytes at T={t}"
  assert large < 2.2 * small, f"temp bytes {small} at T={t} but {large} at T={2 * t}"


@pytest.mark.parametrize("shape", [  # (B, Tq, Tk, N, K, D)
    (0, 5, 7, 2, 1, 16), (1, 0, 7, 2, 1, 16), (1, 5, 0, 2, 1, 16), (2, 5, 7, 0, 1, 16), (0, 0, 0, 0, 1, 16),
    (2, 5, 7, 0, 0, 16)])  # N = K = 0: was a ZeroDivisionError
@pytest.mark.parametrize("is_causal", [False, True])
def test_zero_sizes(shape, is_causal):
  """Empty in, empty out; with no keys (Tk = 0) every row sees nothing: O = O' = 0, lse = -inf, dQ = 0."""
  b, tq, tk, n, _, _ = shape
  q, k, v, do = _inputs(shape, seed=2)
  out, out_hp, lse = jqat.attention_forward(q, k, v, is_causal=is_causal, implementation="xla")
  assert (out.shape, out_hp.shape, lse.shape) == (q.shape, q.shape, (b, n, tq))
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, is_causal=is_causal, implementation="xla").astype(
      jnp.float32) * do.astype(jnp.float32))
  dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
  if tk == 0:
    assert (np.asarray(out, np.float32) == 0).all() and (np.asarray(out_hp, np.float32) == 0).all()
    assert (np.asarray(lse) == -np.inf).all() and (np.asarray(dq, np.float32) == 0).all()
  if n == 0:  # K/V heads that no query head reads get zero gradients
    assert (np.asarray(dk, np.float32) == 0).all() and (np.asarray(dv, np.float32) == 0).all()
