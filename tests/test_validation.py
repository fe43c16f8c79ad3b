"""Bad keywords and inputs of QAT attention: clear errors naming the argument, nothing launched (docs/API.md, 3).

Each case was a crash or a silent misreading before the shared validator (jqat/_src/validate.py):
``is_causal="no"`` and ``quantize_qkv="False"`` read as True, ``block_n="64"`` a raw TypeError,
``block_n=2**40`` an attempted 562 TB allocation, int32 ``d_out`` accepted. The torch shim runs
the same validator, so its messages match.
"""

import inspect

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


@pytest.mark.parametrize("name, value", [
    ("key_value_seq_lengths", np.array([2**32 + 5])),  # read as 5 before
    ("query_seq_lengths", np.array([-(2**32) + 3])),
    ("q_segment_ids", np.full((1, 8), 2**31)),
    ("kv_segment_ids", np.full((1, 8), -(2**31) - 1)),
])
def test_wide_masks_raise_instead_of_wrapping(name, value):
  """int64 lengths and segment ids outside int32's range wrapped silently (kv_len 2**32 + 5 acted as 5): now the
  host-known values raise, naming the argument, in the JAX API and the torch shim (CPU tensors)."""
  seg = np.zeros((1, 8), np.int64)
  kw = {"q_segment_ids": seg, "kv_segment_ids": seg} if "segment" in name else {}
  kw[name] = value
  with pytest.raises(ValueError, match=f"{name} must hold values in int32's range"):
    jqat.attention(Q, Q, Q, implementation="xla", **kw)
  q = torch.zeros(1, 2, 8, 32, dtype=torch.bfloat16)
  with pytest.raises(ValueError, match=f"{name} must hold values in int32's range"):
    jt.attention(q, q, q, **{n: torch.from_numpy(np.asarray(v)) for n, v in kw.items()})


def test_wide_masks_off_the_host_convert_exactly():
  """Where values cannot be checked without a sync (traced JAX int64 under x64, CUDA tensors: exercised here on CPU
  tensors with the host check off), lengths saturate and segment ids are renumbered by rank per batch row: the
  equalities, hence the masks, are those of the given ids."""
  from jqat.torch._attention import int32_masks

  seg = np.array([[2**40, 2**40, 5, 5, -3, -3, 2**40, 7]])
  ranks = np.array([[3, 3, 1, 1, 0, 0, 3, 2]], np.int32)
  q_len, kv_len, q_seg, kv_seg = int32_masks((torch.tensor([2**33]), torch.tensor([-(2**40)]), torch.from_numpy(seg),
                                               torch.from_numpy(seg[:, :5])), host_check=False)
  assert (q_len.tolist(), kv_len.tolist()) == ([2**31 - 1], [-(2**31)])
  assert q_seg.dtype == kv_seg.dtype == torch.int32
  assert (q_seg.numpy() == ranks).all() and (kv_seg.numpy() == ranks[:, :5]).all()
  q = jax.random.normal(jax.random.key(0), (1, 8, 2, 32), jnp.float32).astype(jnp.bfloat16)
  with jax.enable_x64(True):
    got = jax.jit(lambda q, s, n: jqat.attention(q, q, q, implementation="xla", q_segment_ids=s, kv_segment_ids=s,
                                                 key_value_seq_lengths=n))(q, seg, np.array([2**32 + 5]))
  want = jax.jit(lambda q, s, n: jqat.attention(q, q, q, implementation="xla", q_segment_ids=s, kv_segment_ids=s,
                                                key_value_seq_lengths=n))(q, ranks, np.array([8], np.int32))
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("window, match", [((10**12, 0), r"local_window_size\[0\] \(left\) must be at most"),
                                           ((0, 2**31), r"local_window_size\[1\] \(right\) must be at most"),
                                           (2**40, "local_window_size must be at most")])
def test_huge_window_sides_name_the_argument(window, match):
  with pytest.raises(ValueError, match=match):
    jqat.attention(Q, Q, Q, local_window_size=window, implementation="xla")
  q = torch.zeros(1, 2, 8, 32, dtype=torch.bfloat16)
  with pytest.raises(ValueError, match=match):
    jt.attention(q, q, q, local_window_size=window)


@pytest.mark.parametrize("axis", [None, "0", True, 0.0])
def test_nvfp4_axis_must_be_an_int(axis):
  x = jnp.ones((2, 16))
  for fn in (lambda: jqat.nvfp4.fake_quantize(x, axis=axis), lambda: jqat.nvfp4.quantize(x, axis=axis),
             lambda: jqat.nvfp4.dequantize(*jqat.nvfp4.quantize(x), axis=axis)):
    with pytest.raises(TypeError, match="axis must be an int"):
      fn()


def test_parallel_attention_needs_a_mesh():
  import jqat.parallel

  with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
    jqat.parallel.attention(Q, Q, Q, mesh=None)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
  with pytest.raises(ValueError, match="key_value_seq_lengths must hold values in int32's range"):
    jqat.parallel.attention(Q, Q, Q, mesh=mesh, key_value_seq_lengths=np.array([2**32 + 5]), implementation="xla")


@pytest.mark.parametrize("kwargs, exc, match", [(dict(block_n=48), ValueError, "block_n must be one of"),
                                                (dict(block_n="64"), TypeError, "block_n must be an int"),
                                                (dict(implementation="cuda"), ValueError, "implementation must be")])
def test_flax_factory_checks_its_arguments_when_called(kwargs, exc, match):
  """make_attention_fn(block_n=48) returned a function that failed at its first use, inside the model."""
  import jqat.flax

  with pytest.raises(exc, match=match):
    jqat.flax.make_attention_fn(**kwargs)


def test_explicit_forward_and_backward_are_not_differentiable():
  """jax.grad through attention_forward / attention_backward gave a derivative on XLA (of the reference's
  arithmetic) and none on Triton: a result that depends on the backend. Both raise, as second order does."""
  q = jax.random.normal(jax.random.key(0), (1, 8, 2, 32), jnp.float32).astype(jnp.bfloat16)
  o, o_hp, lse = jqat.attention_forward(q, q, q, implementation="xla")
  with pytest.raises(NotImplementedError, match="jqat.attention_forward is not differentiable"):
    jax.grad(lambda q: jnp.sum(jqat.attention_forward(q, q, q, implementation="xla")[1].astype(jnp.float32)))(q)
  with pytest.raises(NotImplementedError, match="jqat.attention_backward is not differentiable"):
    jax.grad(lambda o: jnp.sum(jqat.attention_backward(q, q, q, q, o, lse, implementation="xla")[0].astype(
        jnp.float32)))(o_hp)
  with pytest.raises(NotImplementedError, match="jqat.attention_backward is not differentiable"):
    jax.jvp(lambda lse: jqat.attention_backward(q, q, q, q, o_hp, lse, implementation="xla"), (lse,), (lse,))
  # Undifferentiated calls (also under jit and vmap) are unchanged.
  assert jax.jit(lambda q: jqat.attention_forward(q, q, q, implementation="xla"))(q)[0].shape == q.shape
  assert jax.vmap(lambda q: jqat.attention_forward(q, q, q, implementation="xla")[0])(q[None]).shape == (1,) + q.shape


# A value other than the public default for every option that is neither a switch nor a string of choices (those
# are derived from their fields); a new option of another kind fails the test below until it has one here.
OTHER_VALUES = {"scale": 0.25, "block_n": 32, "local_window_size": (3, 1)}


def _changed(cls=None):
  """``{public keyword: a value other than its default}`` for every option of ``cls``, derived from its fields."""
  from jqat.ffi import options

  cls = cls or options.AttentionOptions
  out = {}
  for name, opt, _ in cls._schema + options.QATConfig._schema:
    if opt.check is options.check_config:
      continue
    if opt.choices:
      out[name] = next(c for c in opt.choices if c != opt.default)
    elif isinstance(opt.default, bool):
      out[name] = not opt.default
    else:
      assert name in OTHER_VALUES, f"give the option {name} a non-default value in OTHER_VALUES"
      out[name] = OTHER_VALUES[name]
  return out


def test_one_schema_drives_the_validator():
  """validate.attention_options takes exactly the public names of AttentionOptions' fields (the switches by name or
  as config=), and each keyword lands in its own field."""
  import dataclasses

  from jqat._src import validate
  from jqat.ffi import options

  fields = [f.name for f in dataclasses.fields(options.AttentionOptions)]
  switches = [f.name for f in dataclasses.fields(options.QATConfig)]
  assert options.public_names() == tuple(n for f in fields for n in (switches if f == "config" else [f]))
  changed = _changed()
  assert set(changed) == set(options.public_names())
  base = validate.attention_options(head_dim=16)
  assert base == options.AttentionOptions(0.25)
  for name, value in changed.items():
    opts = validate.attention_options(head_dim=16, **{name: value})
    config = dataclasses.replace(base.config, **{name: value}) if name in switches else base.config
    want = dataclasses.replace(base, config=config, **({} if name in switches else {name: value}))
    assert opts == want, name
  cfg = options.QATConfig(quantize_p=False)
  assert validate.attention_options(head_dim=16, config=cfg).config == cfg
  with pytest.raises(TypeError, match=r"unknown option\(s\) \['p_scales'\]"):
    validate.attention_options(head_dim=16, p_scales="row")
  with pytest.raises(TypeError, match="either as config= or by their names"):
    validate.attention_options(head_dim=16, config=cfg, quantize_p=False)
  with pytest.raises(TypeError, match="config.quantize_p must be a bool"):
    validate.attention_options(head_dim=16, config=options.QATConfig(quantize_p="no"))


def test_one_schema_drives_the_torch_ops():
  """The static arguments of the three torch ops are AttentionOptions' scalars (names and types from the fields),
  they round-trip every option, and jqat.torch.attention passes each of its keywords through them."""
  from jqat._src import validate
  from jqat.ffi import options
  from jqat.torch import _attention as ta

  static = options.scalar_fields()
  for op in (torch.ops.jqat.attention_fwd, torch.ops.jqat.attention_out, torch.ops.jqat.attention_bwd):
    args = op.default._schema.arguments
    assert [(a.name, str(a.type)) for a in args[-len(static):]] == [(n, t.__name__) for n, t in static]
    assert [a.name for a in args[-len(static) - 4:-len(static)]] == list(options.MASK_OPERANDS)
    assert all(str(a.type) in ("Tensor", "Optional[Tensor]") for a in args[:-len(static)]), op
  changed = _changed()
  every = validate.attention_options(head_dim=16, **changed)
  for opts in (validate.attention_options(head_dim=16), every):
    scalars = options.to_scalars(opts)
    assert [type(v) for v in scalars] == [t for _, t in static]
    assert options.from_scalars(options.AttentionOptions, scalars) == opts
  assert set(changed) <= set(inspect.signature(jt.attention).parameters)
  seen = []
  q = torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(ta, "attention_out_op", lambda *args: seen.append(ta._options(tuple(args[7:]))))
    for name, value in changed.items():
      jt.attention(q, q, q, **{name: value})
      assert seen[-1] == validate.attention_options(head_dim=16, **{name: value}), name


def test_one_schema_drives_jax_and_flax_keywords():
  """jqat.attention takes every public option, and the Flax factory exactly those a call does not decide from its
  mask: each reaches jqat.attention unchanged; the others and unknown keywords raise TypeError naming them."""
  import jqat._src.attention as api
  import jqat.flax
  from jqat._src import validate
  from jqat.ffi import options

  changed = _changed()
  assert set(changed) <= set(inspect.signature(jqat.attention).parameters)
  seen = []
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(api, "_attention", lambda query, key, value, masks, opts, impl: seen.append(opts) or query)
    for name, value in changed.items():
      jqat.attention(Q, Q, Q, implementation="xla", **{name: value})
      assert seen[-1] == validate.attention_options(head_dim=32, **{name: value}), name
  assert set(jqat.flax.FACTORY_OPTIONS) | set(jqat.flax._PER_CALL) == set(options.public_names())
  passed = []
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(jqat.flax, "attention", lambda q, k, v, **kw: passed.append(kw) or q)
    for name in jqat.flax.FACTORY_OPTIONS:
      jqat.flax.make_attention_fn(**{name: changed[name]})(Q, Q, Q)
      assert passed[-1][name] == changed[name], name
  for name in set(jqat.flax._PER_CALL) - {"is_causal"}:  # is_causal: the factory's own keyword (bottom-right)
    with pytest.raises(TypeError, match=f"make_attention_fn does not take {name}"):
      jqat.flax.make_attention_fn(**{name: changed.get(name, True)})
  with pytest.raises(TypeError, match="unknown keyword 'p_scales'"):
    jqat.flax.make_attention_fn(p_scales="row")
