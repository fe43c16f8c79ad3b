"""QAT attention on 1 vs 2 GPUs: batch, head and Ulysses sequence sharding, next to cuDNN's, in one process.

  python benchmarks/sharding.py --out sharding.json [--implementation triton|xla]

Per shape, the step time (median ms, ``benchmarks/attention.py``'s ``time_ms``) of
forward+backward (``jax.grad`` of ``sum(attention(q, k, v) * w)``) for:
  jqat 1 GPU; jqat batch / heads (``jax.jit`` with ``NamedSharding`` inputs, the
  partitioning rules of ``jqat.ffi.partitioning``); jqat Ulysses (``jqat.parallel.attention``
  with ``seq_axis``); cuDNN 1 GPU / batch / heads (``jax.nn.dot_product_attention``).
Each row also counts the collectives of its compiled HLO. Targets (the issue): 2 GPUs at
least 1.8x faster than 1 for batch and head sharding, at least 1.6x for Ulysses at 16k.
``--implementation xla`` runs it anywhere (e.g. 2 virtual CPU devices), cuDNN excluded.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
from _figure import pyplot, save  # noqa: E402
from attention import time_ms
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jqat
from jqat.ffi import partitioning

# (B, T, N, D, causal): the two shapes (N = K: no GQA)
SHAPES = [(2, 16384, 16, 128, True), (8, 4096, 16, 128, False), (8, 4096, 16, 128, True)]
TARGETS = {"batch": 1.8, "heads": 1.8, "ulysses": 1.6}  # speed-up over 1 GPU (Ulysses: at 16k tokens)
SPECS = {"1 GPU": None, "batch": P("x"), "heads": P(None, None, "x")}
SEQUENCE = P(None, "x")  # Ulysses' inputs and outputs: sequence-sharded, as in a sequence-parallel model


def bench_shape(mesh, b, t, n, d, causal, impl, iters, repeats):
  ks = jax.random.split(jax.random.key(t + b), 4)
  q, k, v, w = (jax.random.normal(kk, (b, t, n, d), jnp.float32).astype(jnp.bfloat16) for kk in ks)
  ours = functools.partial(jqat.attention, is_causal=causal, implementation=impl)
  cudnn = functools.partial(jax.nn.dot_product_attention, is_causal=causal, implementation="cudnn")
  ulysses = functools.partial(jqat.parallel.attention, mesh=mesh, seq_axis="x", is_causal=causal,
                              implementation=impl)
  configs = [(f"jqat {name}", ours, spec) for name, spec in SPECS.items()] + [("jqat ulysses", ulysses, SEQUENCE)]
  if impl == "triton":
    configs += [(f"cudnn {name}", cudnn, spec) for name, spec in SPECS.items()]
  rows = []
  for label, attn, spec in configs:
    loss = lambda q, k, v, w, attn=attn: jnp.sum(attn(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))
    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    # spec None: committed to one device, so the program is not partitioned at all.
    where = mesh.devices.flat[0] if spec is None else NamedSharding(mesh, spec)
    args = tuple(jax.device_put(x, where) for x in (q, k, v, w))
    row = {"config": label, "B": b, "T": t, "N": n, "D": d, "causal": causal}
    try:
      row["collectives"] = partitioning.collectives(step.lower(*args).compile().as_text())
      row["fwdbwd_ms"] = time_ms(step, args, iters, repeats)
    except Exception as e:  # noqa: BLE001  (e.g. cuDNN refusing a sharding: say so, keep going)
      row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    rows.append(row)
  for kind in ("jqat", "cudnn"):
    base = next((r.get("fwdbwd_ms") for r in rows if r["config"] == f"{kind} 1 GPU"), None)
    for r in rows:
      if r["config"].startswith(kind) and base and "fwdbwd_ms" in r:
        r["speedup_vs_1"] = base / r["fwdbwd_ms"]
  return rows


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="sharding.json")
  ap.add_argument("--implementation", choices=["triton", "xla"], default="triton")
  ap.add_argument("--shapes", default=None, help="override: 'B,T,N,D,causal;...' e.g. '2,1024,4,64,1'")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()
  if jax.device_count() < 2:
    sys.exit(f"needs 2 devices, JAX sees {jax.device_count()}")
  mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:2])
  shapes = SHAPES if args.shapes is None else [
      tuple(int(x) for x in s.split(",")[:4]) + (s.split(",")[4] == "1",) for s in args.shapes.split(";")]
  result = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "implementation": args.implementation,
            "rows": []}
  print(f"{'shape (B, T, N, D, causal)':<28} {'config':<14} {'fwd+bwd ms':>10} {'x vs 1':>7} {'target':>6}  "
        "collectives")
  for shape in shapes:
    for r in bench_shape(mesh, *shape, args.implementation, args.iters, args.repeats):
      result["rows"].append(r)
      kind = r["config"].split()[-1]
      targeted = r["config"].startswith("jqat") and (kind != "ulysses" or shape[1] >= 16384)
      target = TARGETS.get(kind) if targeted else None
      r["target"] = target
      coll = ", ".join(f"{k} {v}" for k, v in r.get("collectives", {}).items() if v) or "none"
      met = "" if target is None else ("  ok" if r.get("speedup_vs_1", 0) >= target else "  MISSED")
      print(f"{shape!s:<28} {r['config']:<14} {r.get('fwdbwd_ms', float('nan')):>10.3f} "
            f"{r.get('speedup_vs_1', float('nan')):>7.2f} {target or '':>6}  {coll}{met}"
            + (f"  [{r['error']}]" if "error" in r else ""), flush=True)
      with open(args.out, "w") as f:  # after every row: a run cut short keeps what it measured
        json.dump(result, f, indent=1)
  print("wrote", args.out)
  _plot(result["rows"], os.path.splitext(args.out)[0] + ".png")


def _plot(rows, path):
  plt = pyplot()
  if plt is None:
    return

  shapes = list(dict.fromkeys((r["B"], r["T"], r["N"], r["D"], r["causal"]) for r in rows))
  configs = list(dict.fromkeys(r["config"] for r in rows))
  fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(shapes) * len(configs) / 3), 4))
  w = 0.8 / len(configs)
  for j, c in enumerate(configs):
    ys = [next((r.get("fwdbwd_ms", 0) for r in rows if r["config"] == c and
                (r["B"], r["T"], r["N"], r["D"], r["causal"]) == s), 0) for s in shapes]
    ax.bar([i + (j - len(configs) / 2) * w for i in range(len(shapes))], ys, w, label=c)
  ax.set_xticks(range(len(shapes)), [f"{b}x{t}x{n}x{d}{' causal' if c else ''}" for b, t, n, d, c in shapes])
  ax.set_ylabel("fwd+bwd ms")
  ax.legend(fontsize=7)
  save(fig, path)


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
