"""Cold vs warm start of the Triton path: time from a new process to its first attention fwd+bwd result.

  python benchmarks/compile_time.py --out compile_time.json

Runs the same child process twice against one fresh kernel cache directory
(``JQAT_CACHE_DIR``): the first compiles every Triton kernel, the second must
find them on disk. Each child also traces a second, different jitted function
of the same shapes and reports how many kernels that compiled (expected 0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import time, os, sys
t0 = time.perf_counter()
import jax, jax.numpy as jnp
import jqat
q = jnp.ones((1, 1024, 8, 128), jnp.bfloat16) * 0.1
loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, is_causal=True, implementation="triton").astype(jnp.float32))
g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, q, q)
jax.block_until_ready(g)
first = time.perf_counter() - t0
from ffi import triton_call
lib = sys.modules["jax_triton.triton_lib"]
n0 = len(lib._COMPILED_KERNEL_CACHE)
t1 = time.perf_counter()
loss2 = lambda q, k, v: 2.0 * jnp.sum(jqat.attention(q, k, v, is_causal=True, implementation="triton").astype(jnp.float32) ** 2)
jax.block_until_ready(jax.jit(jax.grad(loss2, argnums=(0, 1, 2)))(q, q, q))
second_fn = time.perf_counter() - t1
print("RESULT", first, second_fn, len(lib._COMPILED_KERNEL_CACHE) - n0)
"""


def run_child(env):
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
  wall = time.perf_counter() - t0
  line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")][-1].split()
  return dict(process_wall_s=wall, first_result_s=float(line[1]), second_function_same_shapes_s=float(line[2]),
              kernels_compiled_by_second_function=int(line[3]))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="compile_time.json")
  args = ap.parse_args()
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, JQAT_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    cold = run_child(env)
    warm = run_child(env)
    files = sum(len(f) for _, _, f in os.walk(cache))
  result = dict(cold=cold, warm=warm, cached_kernel_files=files)
  for name in ("cold", "warm"):
    r = result[name]
    print(f"{name}: first result {r['first_result_s']:.2f} s after start (process {r['process_wall_s']:.2f} s); "
          f"a second jitted function of the same shapes: {r['second_function_same_shapes_s']:.2f} s, "
          f"{r['kernels_compiled_by_second_function']} kernels compiled")
  print(f"kernels on disk: {files}")
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
