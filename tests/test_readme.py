"""The README's code runs as written: its "Use" block whole, its serving block at a small cache size."""

import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _block(section: str) -> str:
  """The first ``python`` code block after the README heading ``section``."""
  text = (ROOT / "README.md").read_text()
  after = text.split(f"\n## {section}\n", 1)[1]
  return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_use_block_runs():
  scope = {}
  exec(compile(_block("Use"), "README.md (Use)", "exec"), scope)
  assert scope["out"].shape == (2, 256, 16, 128)
  assert scope["dq"].shape == scope["q"].shape and scope["dk"].shape == scope["k"].shape
  assert scope["codes"].shape == (2, 256, 16, 64) and scope["scales"].shape == (2, 256, 16, 8)
  assert all(np.isfinite(np.asarray(scope[name], np.float32)).all() for name in ("out", "dq", "dk", "dv", "x"))


def test_serving_block_runs_at_a_small_size():
  """The block's calls with its shape line replaced by a small cache, the names it leaves to the reader defined:
  three new tokens written at positions 5..7 of each sequence, then decoded over the 8 written positions."""
  lines = _block("Serving: the packed NVFP4 KV cache").splitlines()
  assert lines[0].startswith("B, T, N, K, D = ")
  prelude = """
import jax, jax.numpy as jnp, jqat
B, T, N, K, D = 2, 64, 4, 2, 32
k_new, v_new = (jax.random.normal(jax.random.key(i), (B, 3, K, D), jnp.bfloat16) for i in (0, 1))
positions = jnp.broadcast_to(jnp.arange(5, 8, dtype=jnp.int32), (B, 3))
q = jax.random.normal(jax.random.key(2), (B, 3, N, D), jnp.bfloat16)
kv_lengths = jnp.full((B,), 8, jnp.int32)
"""
  scope = {}
  exec(compile(prelude + "\n".join(lines[1:]), "README.md (Serving)", "exec"), scope)
  codes, scales = scope["k_cache"]
  assert codes.shape == (2, 64, 2, 16) and scales.shape == (2, 64, 2, 2)
  assert scope["out"].shape == (2, 3, 4, 32) and np.isfinite(np.asarray(scope["out"], np.float32)).all()
