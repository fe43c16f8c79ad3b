"""Cold vs warm start: time from a new process to its first attention gradient, with jqat's caches.

  python benchmarks/compile_time.py --out compile_time.json [--implementation triton|xla]
      [--launcher jax-triton|callback]

Runs one child process after another against one fresh cache root (``JQAT_CACHE_DIR``,
with ``TRITON_CACHE_DIR`` unset so Triton's own cache lives there too):

- ``cold``: every cache empty: Triton compiles each kernel, XLA each program.
- ``warm``: a new process with the caches the cold one filled: jqat's kernel cache
  (``kernels/``) spares the Triton compiles while lowering, JAX's persistent
  compilation cache (``xla/``, ``jqat.enable_compilation_cache``) the XLA compiles.
- ``warm_kernel_cache_only``: the same without JAX's cache, to show each cache's share.

Each child reports the seconds from before ``import jax`` to its first gradient (the
figure of the warm-start target, under 3 s on an H200), the Triton kernels and XLA
cache hits/misses before it, and then traces a second, different jitted function of the
same shapes (its kernels are already in memory: expected 0 compiled). ``--implementation
xla`` runs the same on any backend (no Triton) to check the XLA cache alone.
``--launcher`` sets ``JQAT_JAX_LAUNCHER`` in the children: ``callback`` launches Triton's
cubin from ``buffer_callback`` (``jqat.ffi.callback_launch``; its kernels are counted as
the specializations it built or loaded from Triton's cache), ``jax-triton`` (default) the
custom calls.
Each child also records whether it imported torch (the callback launcher must not).
Each child also prints its phases (import jax, backend start, import jqat, inputs,
a first tiny XLA op, trace + lowering, XLA compile or cache load, first run) so the warm start can be broken down.
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
phases = {}
def phase(name, t=[t0]):
  now = time.perf_counter(); phases[name] = now - t[0]; t[0] = now
import jax, jax.numpy as jnp
phase("import_jax")
jax.devices()
phase("backend_init")
import jqat
jqat.attention
phase("import_jqat")
events = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event.rsplit("/", 1)[-1]))
if os.environ["XLA_CACHE"] == "1":
  jqat.enable_compilation_cache()
impl = os.environ["IMPLEMENTATION"]
if os.environ["JQAT_JAX_LAUNCHER"] == "callback":
  kernels = lambda: sys.modules["jqat.ffi.callback_launch"]._compile.cache_info().currsize if (
      "jqat.ffi.callback_launch" in sys.modules) else 0
else:
  kernels = lambda: len(getattr(sys.modules.get("jax_triton.triton_lib"), "_COMPILED_KERNEL_CACHE", ()))
q = jnp.ones((1, 1024, 8, 128), jnp.bfloat16) * 0.1
jax.block_until_ready(q)
phase("inputs")
jax.block_until_ready(jax.jit(lambda x: x * 2)(q))  # the runtime's own first-launch cost, apart from jqat's
phase("first_xla_op")
loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, is_causal=True, implementation=impl).astype(jnp.float32))
lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, q, q)
phase("trace_and_lower")
compiled = lowered.compile()
phase("compile")
g = compiled(q, q, q)
jax.block_until_ready(g)
phase("first_run")
first = time.perf_counter() - t0
n0, hits, misses = kernels(), events.count("cache_hits"), events.count("cache_misses")
t1 = time.perf_counter()
attn = lambda q, k, v: jqat.attention(q, k, v, is_causal=True, implementation=impl).astype(jnp.float32)
loss2 = lambda q, k, v: 2.0 * jnp.sum(attn(q, k, v) ** 2)
jax.block_until_ready(jax.jit(jax.grad(loss2, argnums=(0, 1, 2)))(q, q, q))
second_fn = time.perf_counter() - t1
print("PHASES", " ".join(f"{k}={v:.4f}" for k, v in phases.items()))
print("RESULT", first, n0, hits, misses, second_fn, kernels() - n0, int("torch" in sys.modules))
"""

# The figures of the child's RESULT line, in order.
_RESULT_FIELDS = (("first_result_s", float), ("kernels_compiled_before_first_result", int), ("xla_cache_hits", int),
                  ("xla_cache_misses", int), ("second_function_same_shapes_s", float),
                  ("kernels_compiled_by_second_function", int), ("torch_imported", int))


def run_child(env):
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - t0
  if out.returncode:
    sys.exit(f"child process failed:\n{out.stderr}")
  line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")][-1].split()
  phases = [l for l in out.stdout.splitlines() if l.startswith("PHASES")][-1].split()[1:]
  return {"process_wall_s": wall, **{name: cast(v) for (name, cast), v in zip(_RESULT_FIELDS, line[1:], strict=True)},
          "phases_s": {k: float(v) for k, v in (p.split("=") for p in phases)}}


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="compile_time.json")
  ap.add_argument("--implementation", choices=["triton", "xla"], default="triton")
  ap.add_argument("--launcher", choices=["jax-triton", "callback"], default="jax-triton",
                  help="JQAT_JAX_LAUNCHER of the children (the JAX binding's kernel launcher)")
  args = ap.parse_args()
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  result = {"implementation": args.implementation, "launcher": args.launcher}
  with tempfile.TemporaryDirectory() as cache:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    env.update(JQAT_CACHE_DIR=cache, IMPLEMENTATION=args.implementation, JQAT_JAX_LAUNCHER=args.launcher,
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    for name, xla_cache in (("cold", "1"), ("warm", "1"), ("warm_kernel_cache_only", "0")):
      result[name] = run_child({**env, "XLA_CACHE": xla_cache})
    result["cache_files"] = {d: sum(len(f) for _, _, f in os.walk(os.path.join(cache, d)))
                             for d in sorted(os.listdir(cache))}
  print(f"{'start':<23} {'first grad s':>12} {'process s':>9} {'kernels compiled':>16} {'XLA hits/misses':>15} "
        f"{'2nd fn s':>8} {'2nd fn kernels':>14} {'torch':>5}")
  for name in ("cold", "warm", "warm_kernel_cache_only"):
    r = result[name]
    xla = f"{r['xla_cache_hits']}/{r['xla_cache_misses']}"
    print(f"{name:<23} {r['first_result_s']:>12.2f} {r['process_wall_s']:>9.2f} "
          f"{r['kernels_compiled_before_first_result']:>16} "
          f"{xla:>15} {r['second_function_same_shapes_s']:>8.2f} "
          f"{r['kernels_compiled_by_second_function']:>14} {'yes' if r['torch_imported'] else 'no':>5}")
  for name in ("cold", "warm", "warm_kernel_cache_only"):
    print(f"{name:<23} phases: " + ", ".join(f"{k} {v:.2f}" for k, v in result[name]["phases_s"].items()))
  print("files per cache:", result["cache_files"])
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print("wrote", args.out)


if __name__ == "__main__":
  main()
