"""The XLA path inside a user's own ``jax.shard_map`` (8 virtual CPU devices, batch- and head-sharded)."""

import traceback

import numpy as np
import pytest
from conftest import assert_reordered_equal


def _check(is_causal):
  """In the 8-device child: jqat.attention and its gradients under shard_map (batch- and head-sharded) against
  the unsharded call. The sharded program is compiled differently from the unsharded one: FP32 order only."""
  import functools

  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jqat

  try:
    shard_map = jax.shard_map
  except AttributeError:  # jax < 0.7
    from jax.experimental.shard_map import shard_map

  assert len(jax.devices()) == 8
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (8, 24, 16, 32), jnp.float32).astype(jnp.bfloat16)  # [B, T, N, D]
  k = jax.random.normal(ks[1], (8, 24, 8, 32), jnp.float32).astype(jnp.bfloat16)  # GQA: K = N / 2
  v = jax.random.normal(ks[2], (8, 24, 8, 32), jnp.float32).astype(jnp.bfloat16)
  do = jax.random.normal(ks[3], (8, 24, 16, 32), jnp.float32).astype(jnp.bfloat16)
  attn = functools.partial(jqat.attention, is_causal=is_causal, implementation="xla")

  def grads(q, k, v, do):
    loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  want = {"out": jax.jit(attn)(q, k, v)}
  want.update(zip(("dq", "dk", "dv"), jax.jit(grads)(q, k, v, do)))
  mesh = jax.make_mesh((8,), ("x",))
  for mesh_name, spec in (("batch", P("x")), ("head", P(None, None, "x"))):
    args = [jax.device_put(t, NamedSharding(mesh, spec)) for t in (q, k, v, do)]
    fwd = shard_map(lambda q, k, v: attn(q, k, v), mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    bwd = shard_map(grads, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 3)
    got = {"out": jax.jit(fwd)(*args[:3])}
    got.update(zip(("dq", "dk", "dv"), jax.jit(bwd)(*args)))
    for name, x in got.items():
      assert_reordered_equal(np.asarray(x, np.float32), np.asarray(want[name], np.float32),
                             name=f"{mesh_name}-sharded {name}", dtype="bfloat16")


def run_cases():
  """Child entry point (tests/multidevice.py, started beside the suite by tests/conftest.py)."""
  results = {}
  for is_causal in (False, True):
    try:
      _check(is_causal)
      results[str(is_causal)] = "ok"
    except Exception:  # noqa: BLE001  (reported to the parent test by name)
      results[str(is_causal)] = traceback.format_exc()
  return results


@pytest.fixture(scope="module")
def child_results():
  import multidevice

  return multidevice.run_json("test_shard_map_xla", "run_cases")


@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_and_grad_inside_shard_map(child_results, is_causal):
  assert child_results[str(is_causal)] == "ok", child_results[str(is_causal)]
