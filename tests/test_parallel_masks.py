"""Masks through jqat.parallel: Ulysses with sequence-sharded segment ids, and the mesh entry point.

The CPU twin on 8 virtual devices (XLA reference path) runs in tests/test_parallel.py's 8-device child
(``case_masks`` there); here, the Triton path on two GPUs. Forward and gradients against the unsharded call.
"""

import numpy as np
import pytest
from conftest import HAS_GPU


def case_masks(implementation="xla", mesh_shape=(2, 4)):
  import jax
  import jax.numpy as jnp
  from conftest import assert_reordered_equal
  from jax.sharding import PartitionSpec as P

  import jqat

  b, t, n, d = 2, 64, 4, 32
  ks = jax.random.split(jax.random.key(0), 4)
  q, k, v, w = (jax.random.normal(key, (b, t, n, d), jnp.float32).astype(jnp.bfloat16) for key in ks)
  seg = jnp.asarray(np.repeat(np.array([[0, 0, 1, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, 1, 3]]), t // 8, axis=1),
                    jnp.int32)
  masks = dict(q_segment_ids=seg, kv_segment_ids=seg, query_seq_lengths=jnp.array([64, 50], jnp.int32),
               key_value_seq_lengths=jnp.array([60, 64], jnp.int32), local_window_size=(20, 3))
  kw = dict(is_causal=True, implementation=implementation, block_n=16, **masks)

  def loss_and_grads(attn):
    def loss(q, k, v):
      return jnp.sum(attn(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

  want_loss, want = loss_and_grads(lambda q, k, v: jqat.attention(q, k, v, **kw))(q, k, v)
  checked = []
  mesh = jax.make_mesh(mesh_shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  for axes in ({"seq_axis": "model"}, {"batch_axis": "data", "seq_axis": "model"}, {"batch_axis": "data"},
               {"head_axis": "model"}):
    par = lambda q, k, v, axes=axes: jqat.parallel.attention(q, k, v, mesh=mesh, **axes, **kw)
    got_loss, got = loss_and_grads(par)(q, k, v)
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=2e-5)
    for name, g, e in zip(("dq", "dk", "dv"), got, want):
      assert_reordered_equal(np.asarray(g, np.float32), np.asarray(e, np.float32), name=f"{axes} {name}")
    checked.append(str(axes))
  # ulysses_attention in a user's own shard_map: segment ids sharded over the sequence like the tensors.
  spec, seg_spec = P("data", "model"), P("data", "model")
  lens = P("data")
  sm = jax.shard_map(
    lambda q, k, v, s, ql, kl: jqat.parallel.ulysses_attention(
      q, k, v, axis_name="model", q_segment_ids=s, kv_segment_ids=s, query_seq_lengths=ql, key_value_seq_lengths=kl,
      is_causal=True, implementation=implementation, block_n=16, local_window_size=(20, 3)),
    mesh=mesh, in_specs=(spec, spec, spec, seg_spec, lens, lens), out_specs=spec, check_vma=False)
  out = jax.jit(sm)(q, k, v, seg, masks["query_seq_lengths"], masks["key_value_seq_lengths"])
  ref = jax.jit(lambda q, k, v: jqat.attention(q, k, v, **kw))(q, k, v)
  assert_reordered_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32), name="shard_map ulysses")
  checked.append("shard_map")
  # A global segment-id array of the wrong length is refused before anything is sharded.
  try:
    jqat.parallel.attention(q, k, v, mesh=mesh, seq_axis="model", q_segment_ids=seg[:, :32], kv_segment_ids=seg)
  except ValueError as e:
    assert "q_segment_ids must have shape (2, 64)" in str(e), str(e)
  else:
    raise AssertionError("no error for a short q_segment_ids")
  return checked


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_masks_through_ulysses_and_mesh_on_2_gpus():
  import jax

  if jax.device_count() < 2:
    pytest.skip("needs two GPUs")
  assert len(case_masks("triton", (1, 2))) == 5
