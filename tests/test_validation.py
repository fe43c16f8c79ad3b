"""Bad keywords and inputs of QAT attention: clear errors naming the argument, nothing launched (docs/API.md, 3).

Each case was a crash or a silent misreading before the shared validator (jqat/_src/validate.py):
``is_causal="no"`` and ``quantize_qkv="False"`` read as True, ``block_n="64"`` a raw TypeError,
``block_n=2**40`` an attempted 562 TB allocation, int32 ``d_out`` accepted. The torch shim runs
the same validator, so its messages match.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqat

torch = pytest.importorskip("torch")
import jqat.torch as jt  # noqa: E402

Q = jnp.zeros((1, 8, 2, 32), jnp.bfloat16)

BAD_KEYWORDS = [
    (dict(is_causal="no"), TypeError, "is_causal must be a bool"),
    (dict(is_causal=1), TypeError, "is_causal must be a bool"),
    (dict(quantize_qkv="False"), TypeError, "quantize_qkv must be a bool"),
    (dict(quantize_p=None), TypeError, "quantize_p must be a bool"),
    (dict(high_precision_delta=0), TypeError, "high_precision_delta must be a bool"),
    (dict(quantize_p_backward="yes"), TypeError, "quantize_p_backward must be a bool"),
    (dict(block_n="64"), TypeError, "block_n must be an int"),
    (dict(block_n=None), TypeError, "block_n must be an int"),
    (dict(block_n=True), TypeError, "block_n must be an int"),
    (dict(block_n=2**40), ValueError, "block_n must be one of"),
    (dict(block_n=48), ValueError, "block_n must be one of"),
    (dict(scale="0.1"), TypeError, "scale must be None or a real number"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(implementation=["xla"]), ValueError, "implementation must be one of"),
]


@pytest.mark.parametrize("kwargs, exc, match", BAD_KEYWORDS, ids=lambda c: str(c)[:40])
def test_jax_keywords_are_checked_by_type_and_range(kwargs, exc, match):
  with pytest.raises(exc, match=match):
    jqat.attention(Q, Q, Q, **kwargs)


@pytest.mark.parametrize("kwargs, exc, match", [c for c in BAD_KEYWORDS if "implementation" not in c[0]],
                         ids=lambda c: str(c)[:40])
def test_torch_keywords_are_checked_by_type_and_range(kwargs, exc, match):
  q = torch.zeros(1, 2, 8, 32, dtype=torch.bfloat16)
  with pytest.raises(exc, match=match):
    jt.attention(q, q, q, **kwargs)


def test_numpy_bools_and_ints_are_fine():
  out = jqat.attention(Q, Q, Q, is_causal=np.bool_(True), block_n=np.int64(32), scale=np.float32(0.5),
                       implementation="xla")
  assert out.shape == Q.shape


@pytest.mark.parametrize("which, value, exc, match", [
    ("d_out", Q.astype(jnp.int32), TypeError, "d_out must have the dtype of query"),
    ("d_out", Q.astype(jnp.float32), TypeError, "d_out must have the dtype of query"),
    ("out_for_delta", Q[:, :4], ValueError, "out_for_delta must have the shape of query"),
    ("lse", jnp.zeros((1, 2, 8), jnp.bfloat16), ValueError, "lse must be float32"),
])
def test_backward_inputs(which, value, exc, match):
  args = dict(d_out=Q, out_for_delta=Q, lse=jnp.zeros((1, 2, 8), jnp.float32))
  args[which] = value
  with pytest.raises(exc, match=match):
    jqat.attention_backward(args["d_out"], Q, Q, Q, args["out_for_delta"], args["lse"], implementation="xla")


def test_second_order_gradients_raise_instead_of_zeros():
  """jax.grad of a gradient through jqat.attention was silently all zeros."""
  inner = jax.grad(lambda q: jnp.sum(jqat.attention(q, q, q, implementation="xla").astype(jnp.float32) ** 2))
  with pytest.raises(NotImplementedError, match="first-order gradients only"):
    jax.grad(lambda q: jnp.sum(inner(q).astype(jnp.float32)))(Q + 1)


def test_config_must_be_a_qat_config():
  with pytest.raises(TypeError, match="config must be a jqat.QATConfig"):
    jqat.attention_forward(Q, Q, Q, config=(True, True, True, True))
