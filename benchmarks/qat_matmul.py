"""NVFP4 QAT linear layer on the GPU: jqat.nvfp4.qat_matmul (Pallas, quantizing each tile in the kernel)
against jnp.dot of operands quantized beforehand, and against the XLA reference (quantize + dot in XLA).

  python benchmarks/qat_matmul.py --out out/qat_matmul [--shapes full|quick|tiny] [--configs 128x128x64x8x3,...]

Per shape M x K x N (x: [M, K], w: [K, N], bf16) the table gives milliseconds of
  pallas      qat_matmul(x, w, implementation="pallas"), one launch config per --configs entry
  dot_prequant jnp.dot(fq(x), fq(w)) with fq done outside the timed function: the bare BF16 GEMM,
              the floor for any fused kernel
  xla         qat_matmul(x, w, implementation="xla"): XLA quantizes both operands, then the same dot
  *_fwdbwd    jax.grad of sum(y * dy) through qat_matmul (the backward is XLA dots of fq operands)
and TFLOP/s as 2*M*N*K / time. Times are medians over repeats of back-to-back jitted calls
(``time_ms`` of benchmarks/attention.py). Writes ``<out>/qat_matmul.json`` and ``<out>/qat_matmul.png``.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
from _figure import pyplot  # noqa: E402
from attention import time_ms

from jqat import nvfp4
from jqat._src.qat_matmul import Config

FULL = [(4096, 4096, 4096), (8192, 4096, 4096), (8192, 4096, 14336), (8192, 14336, 4096), (16384, 2048, 2048)]
QUICK = [(4096, 4096, 4096), (8192, 4096, 4096)]
SHAPES = {"full": FULL, "quick": QUICK, "tiny": [(256, 128, 256)]}  # tiny: a CPU smoke test (interpret mode)


def parse_config(text: str) -> Config:
  bm, bn, bk, warps, stages = (int(v) for v in text.split("x"))
  return Config(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)


def config_name(c: Config) -> str:
  return f"{c.block_m}x{c.block_n}x{c.block_k}x{c.num_warps}x{c.num_stages}"


def bench_shape(m, k, n, configs, iters, repeats):
  kx, kw, kd = jax.random.split(jax.random.key(m + k + n), 3)
  x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
  w = (jax.random.normal(kw, (k, n), jnp.float32) / k**0.5).astype(jnp.bfloat16)
  dy = jax.random.normal(kd, (m, n), jnp.float32).astype(jnp.bfloat16)
  xq = jax.jit(lambda x: nvfp4.fake_quantize(x, axis=-1))(x)
  wq = jax.jit(lambda w: nvfp4.fake_quantize(w, axis=0))(w)
  row = {"M": m, "K": k, "N": n}

  def grad_of(fn):
    loss = lambda x, w: jnp.sum(fn(x, w).astype(jnp.float32) * dy.astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1)))

  dot = lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
  row["dot_prequant_ms"] = time_ms(jax.jit(dot), (xq, wq), iters, repeats)
  xla = lambda x, w: nvfp4.qat_matmul(x, w, implementation="xla")
  row["xla_ms"] = time_ms(jax.jit(xla), (x, w), iters, repeats)
  row["xla_fwdbwd_ms"] = time_ms(grad_of(xla), (x, w), iters, repeats)
  pallas_ms = {}
  for i, cfg in enumerate(configs):
    name = config_name(cfg)
    pallas = lambda x, w, cfg=cfg: nvfp4.qat_matmul(x, w, implementation="pallas", config=cfg)
    try:
      pallas_ms[name] = row[f"pallas_{name}_ms"] = time_ms(jax.jit(pallas), (x, w), iters, repeats)
      if i == 0:
        row["pallas_fwdbwd_ms"] = time_ms(grad_of(pallas), (x, w), iters, repeats)
    except Exception as e:  # noqa: BLE001 -- a config Triton refuses (shared memory, registers): report, go on
      row[f"pallas_{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
  if pallas_ms:
    row["pallas_best"] = min(pallas_ms, key=pallas_ms.get)
    row["pallas_best_ms"] = pallas_ms[row["pallas_best"]]
    row["ratio_pallas_vs_dot"] = row["pallas_best_ms"] / row["dot_prequant_ms"]
  flop = 2 * m * n * k
  for key in ("dot_prequant_ms", "xla_ms", "pallas_best_ms"):
    if key in row:
      row[key.replace("_ms", "_tflops")] = flop / row[key] / 1e9
  return row


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="out/qat_matmul", help="output directory")
  ap.add_argument("--shapes", choices=list(SHAPES), default="full")
  ap.add_argument("--configs", default=config_name(Config()),
                  help="comma-separated BMxBNxBKxWARPSxSTAGES launch configs for the Pallas kernel (first: default)")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()
  configs = [parse_config(c) for c in args.configs.split(",")]
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "qat_matmul.json")
  rows = []
  result = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "dtype": "bfloat16",
            "configs": [config_name(c) for c in configs], "rows": rows}
  print(f"{'M':>6} {'K':>6} {'N':>6} | {'dot(fq,fq)':>10} {'xla':>8} {'pallas':>8} {'config':>16} | "
        f"{'pallas/dot':>10} | {'TF/s dot':>8} {'pallas':>7} | {'fwd+bwd pallas':>14} {'xla':>8}")
  for m, k, n in SHAPES[args.shapes]:
    r = bench_shape(m, k, n, configs, args.iters, args.repeats)
    rows.append(r)
    g = lambda key, r=r: r.get(key, float("nan"))
    print(f"{m:>6} {k:>6} {n:>6} | {g('dot_prequant_ms'):>10.3f} {g('xla_ms'):>8.3f} {g('pallas_best_ms'):>8.3f} "
          f"{r.get('pallas_best', '-'):>16} | {g('ratio_pallas_vs_dot'):>10.2f} | {g('dot_prequant_tflops'):>8.0f} "
          f"{g('pallas_best_tflops'):>7.0f} | {g('pallas_fwdbwd_ms'):>14.3f} {g('xla_fwdbwd_ms'):>8.3f}", flush=True)
    for key in [key for key in r if key.endswith("_error")]:
      print(f"   {key}: {r[key]}")
    with open(path, "w") as f:  # after every row: a run cut short keeps what it measured
      json.dump(result, f, indent=1)
  print("wrote", path)
  _plot(rows, os.path.join(args.out, "qat_matmul.png"))


def _plot(rows, path):
  plt = pyplot()
  if plt is None:
    return

  labels = [f"{r['M']}x{r['K']}x{r['N']}" for r in rows]
  series = [("dot_prequant_ms", "jnp.dot of pre-quantized bf16"), ("xla_ms", "XLA reference (fq + dot)"),
            ("pallas_best_ms", "Pallas qat_matmul (fq in kernel)")]
  fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.4), 4))
  width = 0.8 / len(series)
  for j, (key, label) in enumerate(series):
    ax.bar([i + (j - 1) * width for i in range(len(rows))], [r.get(key, 0) for r in rows], width, label=label)
  ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
  ax.set_ylabel("ms (M x K x N, bf16)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print("wrote", path)


if __name__ == "__main__":
  main()
