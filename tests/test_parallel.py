"""Sharded jqat: partitioning rules of the custom calls (jqat.ffi.partitioning) and jqat.parallel.

CPU: every case runs in one child process with 8 virtual devices (tests/multidevice.py)
on a (data=2, model=4) mesh, against the unsharded call on the same inputs:
- the XLA path under jit + NamedSharding (batch, heads, both): forward and gradients,
  no collective in the compiled HLO;
- the Triton path's partitioning wrapper, with a pure-JAX stand-in for the jax-triton
  launches (``jqat.ffi.jax_launch.execute``) run on the local shard: collective-free for
  batch/head sharding under Shardy and GSPMD, a clear error for sequence sharding,
  gathered heads when K does not divide, vmap outside, shard_map around it, rope_qdq;
- jqat.parallel: Ulysses over the sequence axis and data x sequence, forward and
  gradients, all-to-alls only.
GPU (2+ devices): the same on the Triton kernels, bitwise against the unsharded call.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import traceback

import numpy as np
import pytest
from conftest import HAS_GPU, assert_reordered_equal

SHAPE = {"B": 2, "T": 64, "N": 8, "K": 4, "D": 32}  # K = 4 divides the model axis; T covers 4 tiles of block_n=16
BLOCK_N = 16


# ----------------------------------------------------------------------------- helpers (child and GPU tests)


def _inputs(B, T, N, K, D, seed=0):
  b, t, n, k, d = B, T, N, K, D
  import jax
  import jax.numpy as jnp

  ks = jax.random.split(jax.random.key(seed), 4)
  return (jax.random.normal(ks[0], (b, t, n, d), jnp.bfloat16), jax.random.normal(ks[1], (b, t, k, d), jnp.bfloat16),
          jax.random.normal(ks[2], (b, t, k, d), jnp.bfloat16), jax.random.normal(ks[3], (b, t, n, d), jnp.bfloat16))


def _mesh(shape=(2, 4), names=("data", "model")):
  import jax

  devices = jax.devices()[:int(np.prod(shape))]
  return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names), devices=devices)


def _put(mesh, spec, *xs):
  import jax
  from jax.sharding import NamedSharding

  return tuple(jax.device_put(x, NamedSharding(mesh, spec)) for x in xs)


def _collectives(fn, *args) -> dict:
  import jax

  from jqat.ffi import partitioning

  return partitioning.collectives(jax.jit(fn).lower(*args).compile().as_text())


def _attention_and_grads(attn):
  """``f(q, k, v, w) -> (out, dq, dk, dv)`` of ``sum(attn(q, k, v) * w)``."""
  import jax
  import jax.numpy as jnp

  def f(q, k, v, w):
    loss = lambda q, k, v: (attn(q, k, v).astype(jnp.float32) * w.astype(jnp.float32)).sum()
    out = attn(q, k, v)
    return (out, *jax.grad(loss, argnums=(0, 1, 2))(q, k, v))
  return f


def _check_same(got, want, *, bitwise=False):
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    g, w = np.asarray(g.astype("float32")), np.asarray(w.astype("float32"))
    if bitwise:  # the same kernels on the same rows: nothing is reordered
      np.testing.assert_array_equal(g, w, err_msg=name)
    else:  # two differently compiled XLA programs (local shapes differ)
      assert_reordered_equal(g, w, name=name, dtype=np.dtype("bfloat16"))


def _no_collectives(counts: dict, what: str):
  assert not any(counts.values()), f"{what}: collectives in the compiled HLO: {counts}"


# ----------------------------------------------------------------------------- child cases (8 CPU devices)


def _xla(**kw):
  import jqat

  return functools.partial(jqat.attention, is_causal=True, block_n=BLOCK_N, implementation="xla", **kw)


def case_xla_batch_heads():
  from jax.sharding import PartitionSpec as P

  q, k, v, w = _inputs(**SHAPE)
  mesh = _mesh()
  f = _attention_and_grads(_xla())
  want = jax_jit(f)(q, k, v, w)
  for spec in (P("data"), P(None, None, "model"), P("data", None, "model")):
    args = _put(mesh, spec, q, k, v, w)
    _no_collectives(_collectives(f, *args), f"xla {spec}")
    got = jax_jit(f)(*args)
    assert (tuple(got[0].sharding.spec) + (None,) * 3)[:3] == (tuple(spec) + (None,) * 3)[:3], got[0].sharding
    _check_same(got, want)


def jax_jit(f):
  import jax

  return jax.jit(f)


class _StandIn:
  """Replaces ``jqat.ffi.jax_launch.execute``: the pure-JAX reference of a plan, run on whatever shard it is given.

  Records the shapes it saw, so a test can check the launches ran on local shards.
  """

  def __init__(self, opts, rope_mode=None):
    self.opts, self.rope_mode, self.seen = opts, rope_mode, []

  def __call__(self, plan, *arrays, launcher=None):
    import jax.numpy as jnp

    from jqat._src import attention_reference, rope_qdq_reference
    from jqat.nvfp4 import fake_quantize

    self.seen.append((plan.outputs, tuple(tuple(a.shape) for a in arrays)))
    o = self.opts
    if plan.outputs[:3] == ("o", "o_hp", "lse"):  # then fq(X) of each X the plan keeps (keep_quantized)
      kept = [arrays["qkv".index(name[0])] for name in plan.outputs[3:]]
      return attention_reference.forward(*arrays, scale=o.scale, is_causal=o.is_causal, block_n=o.block_n,
                                         cfg=o.config) + tuple(fake_quantize(x).astype(x.dtype) for x in kept)
    if plan.outputs == ("dq", "dk", "dv"):
      return attention_reference.backward(*arrays, scale=o.scale, is_causal=o.is_causal, cfg=o.config)
    if plan.outputs in (("x_hat",), ("w_hat",)):  # a quantize pass of qat_matmul: rows of x, columns of w
      out = plan.buffers[plan.outputs[0]]
      return (fake_quantize(arrays[0], axis=-1 if plan.outputs == ("x_hat",) else 0).astype(out.dtype),)
    x, cache, positions = arrays
    heads = plan.launches[0].args[5]
    rows = jnp.repeat(positions, heads)
    return (rope_qdq_reference.rope_qdq(x.reshape(-1, x.shape[-1]), cache, rows, self.rope_mode).reshape(x.shape),)


def _triton_wrapper(monkeypatch_execute=True):
  """The Triton path's entry points with the stand-in: ``(attn(q, k, v), stand_in)``."""
  import jax

  from jqat.ffi import jax_launch
  from jqat.ffi.options import AttentionOptions, QATConfig

  # P unquantized: these cases compare differently compiled programs, and FP32 reordering noise
  # in the scores can flip an fq(P) code (a step of the quantizer, not a rounding step).
  # Q, K, V stay quantized (elementwise, exact in any program).
  config = QATConfig(quantize_p=False, quantize_p_backward=False)
  opts = AttentionOptions(scale=0.25, is_causal=True, block_n=BLOCK_N, config=config)
  stand_in = _StandIn(opts)
  jax_launch.execute = stand_in

  @jax.custom_vjp
  def attn(q, k, v):
    return jax_launch.attention_forward(q, k, v, opts)[0]

  def fwd(q, k, v):  # as jqat.attention's VJP: the forward's fq(X) are the residuals
    o, o_hp, lse, k_hat, v_hat = jax_launch.attention_forward(q, k, v, opts, keep_quantized=True)
    return o, (q, k_hat, v_hat, o_hp, lse)

  def bwd(res, d_out):
    q, k, v, o_hp, lse = res
    return jax_launch.attention_backward(d_out, q, k, v, o_hp, lse, opts, quantized=("k", "v"))

  attn.defvjp(fwd, bwd)
  return attn, stand_in


def _triton_partitioned(partitioner: str):
  import jax
  from jax.sharding import PartitionSpec as P

  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  try:
    attn, stand_in = _triton_wrapper()
    q, k, v, w = _inputs(**SHAPE)
    mesh = _mesh()
    f = _attention_and_grads(attn)
    want = jax_jit(f)(q, k, v, w)
    b, t, n, kh, d = SHAPE.values()
    cases = ((P("data"), (b // 2, t, n, kh)), (P(None, None, "model"), (b, t, n // 4, kh // 4)),
             (P("data", None, "model"), (b // 2, t, n // 4, kh // 4)))
    for spec, local in cases if partitioner == "shardy" else cases[2:]:  # GSPMD: deprecated, one case
      args = _put(mesh, spec, q, k, v, w)
      stand_in.seen.clear()  # the per-shard function is traced when the partitioner runs, at compile time
      _no_collectives(_collectives(f, *args), f"triton wrapper, {partitioner}, {spec}")
      got = jax_jit(f)(*args)
      # JAX traces the op once on global shapes (to build it) and the partitioner once per shard shape.
      lb, lt, ln, lk = local
      assert (("o", "o_hp", "lse", "k_hat", "v_hat"), ((lb, lt, ln, d), (lb, lt, lk, d), (lb, lt, lk, d))) \
          in stand_in.seen, stand_in.seen
      assert (("dq", "dk", "dv"), ((lb, lt, ln, d), (lb, lt, ln, d), (lb, lt, lk, d), (lb, lt, lk, d), (lb, lt, ln, d),
                                   (lb, ln, lt))) in stand_in.seen, stand_in.seen
      _check_same(got, want)
  finally:
    jax.config.update("jax_use_shardy_partitioner", True)


def case_triton_wrapper_shardy():
  _triton_partitioned("shardy")


def case_triton_wrapper_gspmd():
  _triton_partitioned("gspmd")


def case_triton_wrapper_sequence_raises():
  from jax.sharding import PartitionSpec as P

  attn, _ = _triton_wrapper()
  q, k, v, w = _inputs(**SHAPE)
  args = _put(_mesh(), P(None, "model"), q, k, v, w)
  try:
    jax_jit(_attention_and_grads(attn))(*args)
  except (ValueError, RuntimeError) as e:  # XLA wraps the callback's ValueError in its runtime error
    assert "sequence axis" in str(e) and "jqat.parallel.ulysses_attention" in str(e), str(e)[-800:]
  else:
    raise AssertionError("a sequence-sharded query ran without an error")


def case_triton_wrapper_gqa_indivisible():
  """Query heads over a 4-way axis, K = 2 KV heads: heads are gathered (correct), never split inside a KV group."""
  from jax.sharding import PartitionSpec as P

  attn, stand_in = _triton_wrapper()
  shape = dict(SHAPE, K=2)
  q, k, v, w = _inputs(**shape)
  f = _attention_and_grads(attn)
  want = jax_jit(f)(q, k, v, w)
  stand_in.seen.clear()
  q_sharded, w_sharded = _put(_mesh(), P(None, None, "model"), q, w)
  got = jax_jit(f)(q_sharded, k, v, w_sharded)
  assert stand_in.seen and all(shapes[0][2] == shape["N"] for _, shapes in stand_in.seen), stand_in.seen
  _check_same(got, want)


def case_triton_wrapper_vmap_and_shard_map():
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  attn, _ = _triton_wrapper()
  q, k, v, _ = _inputs(**SHAPE)
  mesh = _mesh()
  # vmap outside the partitioned op: the vmapped axis folds into B (major), so its sharding carries over.
  qs, ks, vs = (jnp.stack([x, x[::-1]]) for x in (q, k, v))
  want = jax.vmap(attn)(qs, ks, vs)
  args = _put(mesh, P("data", None, None, "model"), qs, ks, vs)
  vm = lambda *a: jax.vmap(attn)(*a)
  _no_collectives(_collectives(vm, *args), "vmap of the triton wrapper")
  assert_reordered_equal(np.asarray(jax_jit(vm)(*args), np.float32), np.asarray(want, np.float32), name="vmap")
  # Inside a fully manual shard_map the custom calls see local shapes and no rule is consulted.
  sm = jax.shard_map(attn, mesh=mesh, in_specs=P("data", None, "model"), out_specs=P("data", None, "model"),
                     check_vma=False)
  assert_reordered_equal(np.asarray(jax_jit(sm)(q, k, v), np.float32),
                         np.asarray(jax_jit(attn)(q, k, v), np.float32), name="shard_map")


def case_triton_wrapper_rope_qdq():
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  from jqat._src import rope_qdq_reference
  from jqat.ffi import jax_launch
  from jqat.ffi.options import AttentionOptions

  mode = rope_qdq_reference.MODES[("fp4", 32, "ue8m0")]
  stand_in = _StandIn(AttentionOptions(scale=1.0), rope_mode=mode)
  jax_launch.execute = stand_in
  ks = jax.random.split(jax.random.key(3), 3)
  x = jax.random.normal(ks[0], (16, 8, 128), jnp.bfloat16)
  cache = jax.random.normal(ks[1], (32, 64), jnp.float32)
  positions = jax.random.randint(ks[2], (16,), 0, 32, jnp.int32)
  f = lambda x, cache, positions: jax_launch.rope_qdq(x, cache, positions, heads=8, group=mode.group, fp8=mode.fp8,
                                                      e4m3_scale=mode.e4m3_scale, amax_floor=mode.floor)
  want = jax_jit(f)(x, cache, positions)
  mesh = _mesh()
  for spec_x, spec_p in ((P("data"), P("data")), (P("data", "model"), P("data"))):
    args = (*_put(mesh, spec_x, x), cache, *_put(mesh, spec_p, positions))
    stand_in.seen.clear()
    _no_collectives(_collectives(f, *args), f"rope_qdq {spec_x}")
    got = jax_jit(f)(*args)
    local = (8, 2 if len(spec_x) == 2 else 8, 128)  # 16 tokens over data=2, 8 heads over model=4
    assert any(shapes == (local, (32, 64), (8,)) for _, shapes in stand_in.seen), stand_in.seen
    # The reference is bit-exact by construction (integer logic on the bits), so sharding changes nothing.
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def case_triton_wrapper_qat_matmul():
  """qat_matmul's quantize passes run on local shards (jqat.ffi.partitioning.fake_quantize_spec): x's rows over
  data, w's columns over model (column-parallel) or x's and w's K over model in whole blocks (row-parallel); the
  passes add no collective (the row-parallel dot's partial sums are XLA's one all-reduce), and the product and its
  gradients are those of the unsharded call."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  from jqat._src import qat_matmul as qm
  from jqat.ffi import jax_launch
  from jqat.ffi.options import AttentionOptions

  stand_in = _StandIn(AttentionOptions(scale=1.0))
  jax_launch.execute = stand_in
  ks = jax.random.split(jax.random.key(4), 3)
  x = jax.random.normal(ks[0], (8, 16, 256), jnp.bfloat16)
  w = jax.random.normal(ks[1], (256, 64), jnp.bfloat16)
  dy = jax.random.normal(ks[2], (8, 16, 64), jnp.bfloat16)
  fwd = lambda x, w: qm._qat_matmul(x, w, "triton")
  f = lambda x, w: (fwd(x, w), *jax.vjp(fwd, x, w)[1](dy))
  want = jax_jit(f)(x, w)
  mesh = _mesh()
  # (x's spec, w's spec, collectives the forward may hold, the local shapes the two passes see)
  cases = ((P("data"), P(), {}, [(4, 16, 256), (256, 64)]),
           (P("data"), P(None, "model"), {}, [(4, 16, 256), (256, 16)]),
           (P("data", None, "model"), P("model"), {"all-reduce", "reduce-scatter"}, [(4, 16, 64), (64, 64)]))
  for spec_x, spec_w, allowed, local in cases:
    args = (*_put(mesh, spec_x, x), *_put(mesh, spec_w, w))
    counts = _collectives(fwd, *args)
    assert not any(n for name, n in counts.items() if name not in allowed), (spec_x, spec_w, counts)
    # Seen in this case or an earlier one (JAX keeps a traced shard function for a sharding it has partitioned).
    seen = {shapes[0] for _, shapes in stand_in.seen}
    assert set(local) <= seen, (spec_x, spec_w, seen)
    got = jax_jit(f)(*args)
    for name, g, r in zip(("y", "dx", "dw"), got, want):
      assert_reordered_equal(np.asarray(g, np.float32), np.asarray(r, np.float32), name=f"{name} {spec_x} {spec_w}",
                             dtype=np.dtype("bfloat16"))


def case_ulysses():
  import jax
  from jax.sharding import PartitionSpec as P

  import jqat

  q, k, v, w = _inputs(**SHAPE)
  mesh = _mesh()
  want = jax_jit(_attention_and_grads(_xla()))(q, k, v, w)
  meshes = ((_mesh((4,), ("model",)), {"seq_axis": "model"}), (mesh, {"batch_axis": "data", "seq_axis": "model"}))
  for m, axes in meshes:
    par = functools.partial(jqat.parallel.attention, mesh=m, is_causal=True, block_n=BLOCK_N, implementation="xla",
                            **axes)
    f = _attention_and_grads(par)
    counts = _collectives(f, q, k, v, w)
    assert counts["all-to-all"] > 0 and counts["all-gather"] == 0 and counts["all-reduce"] == 0, (axes, counts)
    got = jax_jit(f)(q, k, v, w)
    assert got[0].sharding.spec[:2] == (axes.get("batch_axis"), "model"), got[0].sharding
    _check_same(got, want)
  # ulysses_attention in a user's own shard_map, sequence sharded in and out.
  spec = P("data", "model")
  sm = jax.shard_map(lambda q, k, v: jqat.parallel.ulysses_attention(q, k, v, axis_name="model", **_xla().keywords),
                     mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
  assert_reordered_equal(np.asarray(jax_jit(sm)(q, k, v), np.float32), np.asarray(want[0], np.float32), name="sm")


def case_ulysses_errors():
  import jqat

  q, k, v, _ = _inputs(**dict(SHAPE, K=2))
  mesh = _mesh()
  for call, match in ((lambda: jqat.parallel.attention(q, k, v, mesh=mesh, seq_axis="model", implementation="xla"),
                       "key heads (2) must be divisible by the size of axis 'model' (4)"),
                      (lambda: jqat.parallel.attention(q, k, v, mesh=mesh, seq_axis="nope"),
                       "seq_axis must name axes of mesh"),
                      (lambda: jqat.parallel.attention(q, k, v, mesh=mesh, batch_axis="model", seq_axis="model"),
                       "distinct mesh axes"),
                      (lambda: jqat.parallel.attention(q[:, :62], k, v, mesh=mesh, seq_axis="model"),
                       "T=62 into 4 parts")):
    try:
      call()
    except ValueError as e:
      assert match in str(e), str(e)
    else:
      raise AssertionError(f"no error for {match!r}")


def case_train_lm_mesh():
  """The demo's --mesh data=2,seq=2 model: the loss of the one-device model; three sharded QAT training steps."""
  import dataclasses

  import jax
  import jax.numpy as jnp
  import train_lm
  from flax import nnx

  assert train_lm.parse_mesh("data=2,seq=2") == {"data": 2, "seq": 2}
  cfg = dataclasses.replace(train_lm.CONFIGS["tiny"], num_heads=2)  # 2 heads: Ulysses over seq=2
  mesh = train_lm.make_mesh({"data": 2, "seq": 2})
  batch = jnp.asarray(next(train_lm.train_batches(*train_lm.load_corpus(cfg)[:1], cfg, seed=0)))
  # The loss only: the model's BF16 projections accumulate their parameter gradients in BF16, so
  # those depend on how the batch is split; attention's own gradients are checked in case_ulysses.
  loss = nnx.jit(train_lm.loss_fn)
  loss0, loss1 = (loss(train_lm.make_model(cfg, train_lm.BF16_OFF, mesh=m), batch) for m in (None, mesh))
  assert_reordered_equal(np.float32(loss1), np.float32(loss0), name="loss")
  # Three training steps (past the warmup of 2) on batches sharded over data
  # (the whole --tiny demo takes a minute here).
  train_data, val_data, _ = train_lm.load_corpus(cfg)
  place = lambda x: jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  val = jax.device_put(jnp.asarray(train_lm.val_batches(val_data, cfg)),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "data")))
  curves = train_lm.train(train_lm.make_model(cfg, {}, mesh=mesh), cfg, train_data, val, steps=3, lr=1e-3, seed=0,
                          label="mesh", place=place)
  assert np.isfinite(curves["loss"]).all() and np.isfinite(curves["val_loss"]).all(), curves


def case_masks():
  """Masks through Ulysses and the mesh entry point (tests/test_parallel_masks.py), in this child."""
  from test_parallel_masks import case_masks as check

  assert len(check()) == 5


CASES = [name for name in list(globals()) if name.startswith("case_")]


def run_cases() -> dict:
  """Child entry point: every case, ``"ok"`` or its traceback."""
  import jax

  assert jax.device_count() == 8, jax.devices()
  from jqat.ffi import jax_launch

  execute = jax_launch.execute
  results = {}
  for name in CASES:
    try:
      globals()[name]()
      results[name] = "ok"
    except Exception:  # noqa: BLE001  (reported to the parent test by name)
      results[name] = traceback.format_exc()
    finally:
      jax_launch.execute = execute
  return results


@pytest.fixture(scope="module")
def child_results():
  import multidevice

  return multidevice.run_json("test_parallel", "run_cases")


@pytest.mark.parametrize("case", CASES)
def test_on_8_cpu_devices(child_results, case):
  assert child_results[case] == "ok", child_results[case]


def test_torch_ulysses_two_gloo_processes(tmp_path):
  """examples/torch_ulysses.py: 2 CPU ranks (gloo), all-to-all around jqat.torch.attention, vs the unsharded call."""
  import multidevice

  out = tmp_path / "ulysses"
  proc = subprocess.run([sys.executable, "examples/torch_ulysses.py", "--out", str(out)], cwd=multidevice.ROOT,
                        env={**os.environ, "PYTHONPATH": multidevice.ROOT}, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  for rank in range(2):
    saved = np.load(f"{out}.rank{rank}.npz")
    for name in ("out", "dq", "dk", "dv"):  # the local call sees whole sequences of its heads: same rows
      assert_reordered_equal(saved[f"{name}_got"], saved[f"{name}_want"], name=f"rank {rank} {name}",
                             dtype=np.dtype("bfloat16"))


# ----------------------------------------------------------------------------- GPU (2+ devices, Triton kernels)


def _two_gpus():
  import jax

  if not HAS_GPU or jax.device_count() < 2:
    pytest.skip("needs 2 NVIDIA GPUs")
  return _mesh((2,), ("x",))


GPU_SHAPE = {"B": 2, "T": 512, "N": 8, "K": 2, "D": 128}


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["batch", "heads"])
def test_gpu_batch_and_head_sharding_bitwise_and_collective_free(spec):
  from jax.sharding import PartitionSpec as P

  import jqat

  mesh = _two_gpus()
  q, k, v, w = _inputs(**GPU_SHAPE)
  f = _attention_and_grads(functools.partial(jqat.attention, is_causal=True, implementation="triton"))
  want = jax_jit(f)(q, k, v, w)
  args = _put(mesh, P("x") if spec == "batch" else P(None, None, "x"), q, k, v, w)
  _no_collectives(_collectives(f, *args), spec)
  _check_same(jax_jit(f)(*args), want, bitwise=True)


@pytest.mark.gpu
def test_gpu_sequence_sharding_raises():
  from jax.sharding import PartitionSpec as P

  import jqat

  mesh = _two_gpus()
  q, k, v, w = _inputs(**GPU_SHAPE)
  f = _attention_and_grads(functools.partial(jqat.attention, is_causal=True, implementation="triton"))
  with pytest.raises(Exception, match="jqat.parallel.ulysses_attention"):
    jax_jit(f)(*_put(mesh, P(None, "x"), q, k, v, w))


@pytest.mark.gpu
@pytest.mark.parametrize("axes", [{"seq_axis": "x"}, {"batch_axis": "x"}, {"head_axis": "x"}])
def test_gpu_parallel_attention_bitwise(axes):
  import jqat

  mesh = _two_gpus()
  q, k, v, w = _inputs(**GPU_SHAPE)
  want = jax_jit(_attention_and_grads(functools.partial(jqat.attention, is_causal=True, implementation="triton")))(
      q, k, v, w)
  par = functools.partial(jqat.parallel.attention, mesh=mesh, is_causal=True, implementation="triton", **axes)
  f = _attention_and_grads(par)
  counts = _collectives(f, q, k, v, w)
  assert counts["all-gather"] == 0 and counts["all-reduce"] == 0, counts
  _check_same(jax_jit(f)(q, k, v, w), want, bitwise=True)
