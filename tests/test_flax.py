"""jqat.flax: the attention_fn inside flax's nnx and linen attention modules."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_close, assert_reordered_equal
from flax import nnx

import jqat
import jqat.flax

BF16_OFF = dict(quantize_qkv=False, quantize_p=False, high_precision_delta=False, quantize_p_backward=False)
# Both sides compute in bf16 (projections, attention output) but round at different
# places: flax's XLA attention keeps bf16 logits, jqat's FP32 logits and bf16(P).
# A few bf16 half-ulps (2**-9 = 2e-3 each) of relative error: 1e-2.
BF16_REL = 1e-2
B, T, FEATURES, HEADS = 2, 40, 128, 2  # head dim 64; T=40 is not a multiple of block_n


def _inputs(seed=1):
  return jax.random.normal(jax.random.key(seed), (B, T, FEATURES), jnp.float32)


def _nnx_mha(attention_fn, **kw):
  kw = dict(attention_fn=attention_fn, **kw) if attention_fn is not None else kw
  return nnx.MultiHeadAttention(num_heads=HEADS, in_features=FEATURES, dtype=jnp.bfloat16, decode=False,
                                rngs=nnx.Rngs(0), **kw)


def _as64(x):
  return np.asarray(x.astype(jnp.float32), np.float64)


@pytest.mark.parametrize("call", ["none", "causal_mask", "is_causal", "all_true_mask"])
def test_nnx_matches_flax_default(call):
  x = _inputs()
  kw = {"none": {}, "causal_mask": dict(mask=nnx.make_causal_mask(x[..., 0])), "is_causal": dict(is_causal=True),
        "all_true_mask": dict(mask=jnp.ones((B, 1, T, T), bool))}[call]
  expected = _nnx_mha(None)(x, **kw)
  actual = _nnx_mha(jqat.flax.make_attention_fn(**BF16_OFF))(x, **kw)
  assert actual.dtype == expected.dtype == jnp.bfloat16
  assert_close(_as64(actual), _as64(expected), rel=BF16_REL, name=f"nnx output ({call})")


@pytest.mark.parametrize("causal", [False, True])
def test_linen_matches_flax_default(causal):
  x = _inputs()
  mask = nn.make_causal_mask(x[..., 0]) if causal else None
  make = lambda **kw: nn.MultiHeadDotProductAttention(num_heads=HEADS, qkv_features=FEATURES, dtype=jnp.bfloat16, **kw)
  params = make().init(jax.random.key(0), x, x, mask=mask)
  expected = make().apply(params, x, x, mask=mask)
  actual = make(attention_fn=jqat.flax.make_attention_fn(**BF16_OFF)).apply(params, x, x, mask=mask)
  assert_close(_as64(actual), _as64(expected), rel=BF16_REL, name=f"linen output (causal={causal})")


def test_nnx_grads_match_flax_default():
  """The backward through the module agrees too (the switches off make it plain attention)."""
  x = _inputs()
  loss = lambda m: jnp.sum(jnp.sin(m(x, is_causal=True).astype(jnp.float32)))
  ref, ours = _nnx_mha(None), _nnx_mha(jqat.flax.make_attention_fn(**BF16_OFF))
  g_ref, g_ours = nnx.grad(loss)(ref), nnx.grad(loss)(ours)
  # bf16 gradients of a bf16 module; one more bf16 rounding per matmul than the forward.
  for (path, a), (_, e) in zip(nnx.to_flat_state(g_ours), nnx.to_flat_state(g_ref)):
    if path == ("key", "bias"):  # exactly 0 in exact math (softmax is shift-invariant): only rounding noise
      continue
    assert_close(_as64(a[...]), _as64(e[...]), rel=2 * BF16_REL, name=f"grad {'/'.join(map(str, path))}")


@pytest.mark.parametrize("how", ["causal_mask", "is_causal_call", "is_causal_factory"])
def test_masks_map_to_the_kernel_flags(how):
  """The attention_fn equals jqat.attention with the mapped is_causal, bit for bit."""
  q, k, v = (jax.random.normal(jax.random.key(i), (B, T, HEADS, 64), jnp.bfloat16) for i in range(3))
  fn = jqat.flax.make_attention_fn(is_causal=how == "is_causal_factory")
  kw = {"causal_mask": dict(mask=nnx.make_causal_mask(q[..., 0, 0])),
        "is_causal_call": dict(is_causal=True), "is_causal_factory": {}}[how]
  # Up to FP32 summation order: the adapter's reshapes make XLA compile other programs.
  assert_reordered_equal(fn(q, k, v, **kw), jqat.attention(q, k, v, is_causal=True), name="causal")
  assert_reordered_equal(jqat.flax.attention_fn(q, k, v, mask=jnp.ones((T, T))), jqat.attention(q, k, v),
                         name="all-true mask")


def test_batch_dims_and_dtype():
  """Any number of batch dims (none included); ``dtype`` promotes the inputs like flax does."""
  q = jax.random.normal(jax.random.key(0), (2, 3, 17, 2, 64), jnp.float32)
  out = jqat.flax.attention_fn(q, q, q, dtype=jnp.bfloat16)
  assert out.shape == q.shape and out.dtype == jnp.bfloat16
  flat = jqat.attention(*(q.reshape(6, 17, 2, 64).astype(jnp.bfloat16),) * 3)
  assert_reordered_equal(out.reshape(6, 17, 2, 64), flat, name="flattened batch")
  single = jqat.flax.attention_fn(q[0, 0], q[0, 0], q[0, 0], dtype=jnp.bfloat16)
  assert_reordered_equal(single, out[0, 0], name="no batch dims")


@pytest.mark.parametrize("bad, match", [
    (dict(mask=jnp.tril(jnp.ones((T, T), bool), k=-1)), "cannot be expressed by the jqat kernels; supported: no mask"),
    (dict(mask=jnp.triu(jnp.ones((T, T), bool))), "cannot be expressed by the jqat kernels"),
    (dict(mask=jnp.ones((1, 2, T, T), bool).at[0, 1, 3, 4].set(False)), "cannot be expressed"),  # differs by head
    (dict(mask=jnp.ones((T, T + 1), bool)), r"mask must broadcast to \[batch..., heads, Tq=40, Tk=40\]"),
    (dict(bias=jnp.zeros((1, 1, T, T))), "does not support an attention bias"),
    (dict(dropout_rate=0.1, deterministic=False), "does not support attention dropout"),
    (dict(module=object()), "cannot sow attention weights"),
])
def test_unsupported_arguments_raise(bad, match):
  q = jnp.ones((B, T, HEADS, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match=match):
    jqat.flax.attention_fn(q, q, q, **bad)


def test_dropout_rate_is_fine_when_deterministic():
  q = jnp.ones((B, T, HEADS, 64), jnp.bfloat16)
  jqat.flax.attention_fn(q, q, q, dropout_rate=0.1, deterministic=True)


def test_traced_causal_mask_without_the_factory_promise():
  """A traced causal mask is recognised on the device (no promise needed): same result as eager."""
  x = _inputs()
  causal_mask = lambda: nnx.make_causal_mask(x[..., 0])  # built inside jit: a tracer
  module = _nnx_mha(jqat.flax.attention_fn)
  traced = nnx.jit(lambda m: m(x, mask=causal_mask()))(module)
  assert_reordered_equal(traced, module(x, is_causal=True), name="jit vs eager")


def _padding_and_segments():
  lengths = jnp.array([T, 23])
  live = jnp.arange(T)[None, :] < lengths[:, None]
  segments = jnp.where(live, jnp.arange(T)[None, :] // 13, -1).astype(jnp.int32)  # packed documents + padding
  return {"padding": nnx.make_attention_mask(live, live),
          "segments": nnx.make_attention_mask(segments, segments, jnp.equal),
          "segments_causal": nnx.combine_masks(nnx.make_attention_mask(segments, segments, jnp.equal),
                                               nnx.make_causal_mask(segments))}


@pytest.mark.parametrize("name", ["padding", "segments", "segments_causal"])
@pytest.mark.parametrize("jit", [False, True])
def test_padding_and_segment_masks_match_flax(name, jit):
  """Concrete masks become lengths / segment ids on the host; traced ones segment ids on the device."""
  x = _inputs()
  mask = _padding_and_segments()[name]
  call = lambda m, mask: m(x, mask=mask)
  if jit:
    call = nnx.jit(call)
  expected = call(_nnx_mha(None), mask)
  actual = call(_nnx_mha(jqat.flax.make_attention_fn(**BF16_OFF)), mask)
  # Rows that see no key: flax gives the mean of V (uniform softmax over -inf), jqat gives 0 (docs/NUMERICS.md, 4.3).
  live = np.asarray(mask).any(axis=(1, 3))[..., None]
  assert_close(np.where(live, _as64(actual), 0), np.where(live, _as64(expected), 0), rel=BF16_REL, name=name)
  assert (np.asarray(actual.astype(jnp.float32))[~np.broadcast_to(live, actual.shape)] == 0).all()


def test_traced_mask_without_label_structure_gives_nan():
  """Inside jit a mask the kernels cannot express is not silently replaced: its batch element is NaN."""
  x = _inputs()
  strict = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool), k=-1), (B, 1, T, T))
  mask = jnp.stack([jnp.ones((1, T, T), bool), strict[1]])  # element 0 all-true, element 1 inexpressible
  out = nnx.jit(lambda m, mask: m(x, mask=mask))(_nnx_mha(jqat.flax.attention_fn), mask)
  assert np.isfinite(_as64(out[0])).all() and np.isnan(_as64(out[1])).all()


@pytest.mark.parametrize("factory_causal", [False, True])
def test_nnx_decode_under_jit_matches_flax(factory_causal):
  """MultiHeadAttention(decode=True) under nnx.jit: the cache mask (keys <= cur_index) is traced. It used to be
  taken for the top-left causal mask with is_causal=True (max error 2-3 from the second step on)."""
  steps = 6
  x = _inputs()[:, :steps]

  def decode(attention_fn):
    kw = dict(attention_fn=attention_fn) if attention_fn is not None else {}
    m = nnx.MultiHeadAttention(num_heads=HEADS, in_features=FEATURES, dtype=jnp.bfloat16, decode=True,
                               rngs=nnx.Rngs(0), **kw)
    m.init_cache((B, T, FEATURES), dtype=jnp.bfloat16)
    step = nnx.jit(lambda m, xt: m(xt))
    return [step(m, x[:, t:t + 1]) for t in range(steps)]

  expected = decode(None)
  actual = decode(jqat.flax.make_attention_fn(is_causal=factory_causal, **BF16_OFF))
  for t, (a, e) in enumerate(zip(actual, expected)):
    assert_close(_as64(a), _as64(e), rel=BF16_REL, name=f"decode step {t}")


def test_switches_are_validated():
  with pytest.raises(TypeError, match="quantize_p must be a bool"):
    jqat.flax.make_attention_fn(quantize_p="yes")


class _TinyLM(nnx.Module):
  """Byte embedding, one causal QAT attention layer with a residual, tied unembedding."""

  def __init__(self, rngs):
    self.embed = nnx.Embed(256, FEATURES, rngs=rngs)
    self.attn = _nnx_mha(jqat.flax.make_attention_fn(is_causal=True))
    self.norm = nnx.LayerNorm(FEATURES, rngs=rngs)

  def __call__(self, tokens):
    h = self.embed(tokens)
    h = h + self.attn(self.norm(h)).astype(h.dtype)
    return self.embed.attend(h)


def test_nnx_jit_training_step_lowers_the_loss():
  tokens = jax.random.randint(jax.random.key(2), (B, T + 1), 0, 16)  # 16 symbols: learnable quickly
  model = _TinyLM(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, tokens):
    def loss_fn(model):
      logits = model(tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(step(model, optimizer, tokens)) for _ in range(15)]
  assert all(np.isfinite(losses)), losses
  assert losses[-1] < 0.7 * losses[0], losses


def test_packed_kv_cache_prefill_decode_and_bad_sizes():
  """jqat.flax.PackedKVCache under nnx.jit: prefill writes the prompt and returns causal jqat.attention, decode writes
  the new token after it and returns jqat.decode_attention over the cache that kv_cache_update builds from the same
  keys; every sequence advances by the tokens given. Sizes that are not positive ints raise naming them."""
  b, t, n, kh, d = 2, 8, 4, 2, 32
  keys = jax.random.split(jax.random.key(7), 3)
  q, k, v = (jax.random.normal(kk, (b, t + 1, h, d), jnp.bfloat16) for kk, h in zip(keys, (n, kh, kh)))
  cache = jqat.flax.PackedKVCache(batch=b, capacity=64, kv_heads=kh, head_dim=d)
  prefill = nnx.jit(lambda c, q, k, v: c.prefill(q, k, v, implementation="xla"))
  decode = nnx.jit(lambda c, q, k, v: c.decode(q, k, v, implementation="xla", num_splits=1))
  out_p = prefill(cache, q[:, :t], k[:, :t], v[:, :t])
  assert (np.asarray(cache.lengths[...]) == t).all()
  out_d = decode(cache, q[:, t:], k[:, t:], v[:, t:])
  assert (np.asarray(cache.lengths[...]) == t + 1).all()
  assert_reordered_equal(out_p, jqat.attention(q[:, :t], k[:, :t], v[:, :t], is_causal=True, implementation="xla"),
                         name="prefill O")
  pos = jnp.broadcast_to(jnp.arange(t + 1, dtype=jnp.int32), (b, t + 1))
  kc, vc = jqat.kv_cache_update(jqat.init_kv_cache((b, 64, kh, d)), jqat.init_kv_cache((b, 64, kh, d)), k, v, pos,
                                implementation="xla")
  want = jqat.decode_attention(q[:, t:], kc, vc, jnp.full((b,), t + 1, jnp.int32), num_splits=1, implementation="xla")
  assert_reordered_equal(out_d, want, name="decode O")
  cache.reset()
  assert (np.asarray(cache.lengths[...]) == 0).all()
  for kw, exc in ((dict(batch="8"), TypeError), (dict(capacity=0), ValueError), (dict(head_dim=True), TypeError)):
    with pytest.raises(exc, match=f"PackedKVCache: {next(iter(kw))} must be a positive int"):
      jqat.flax.PackedKVCache(**(dict(batch=b, capacity=64, kv_heads=kh, head_dim=d) | kw))
