"""QAT attention on the GPU: jqat (Triton) vs cuDNN BF16 attention and the XLA reference, in one process.

  python benchmarks/attention.py --out attention.json [--shapes quick|full] [--memory]

Times are medians over repeats of ``iters`` back-to-back calls of a jitted
function, synchronized at the end (JAX dispatch is asynchronous, so launch
overhead is hidden behind the previous call). TFLOP/s counts 4*B*N*Tq*Tk*D for
the forward and 2.5x that for the backward, halved for causal. fwd+bwd is
``jax.grad`` through ``jqat.attention`` (forward with residuals, then backward).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp

import jqat  # noqa: E402

# (B, N, K, S, D, causal)
FULL = [
    (4, 16, 16, 2048, 128, False), (4, 16, 16, 2048, 128, True),
    (1, 16, 16, 4096, 128, False), (1, 16, 16, 4096, 128, True),
    (2, 16, 16, 4096, 64, False), (2, 16, 16, 4096, 64, True),
    (1, 16, 4, 4096, 128, False), (1, 16, 4, 4096, 128, True),  # GQA
    (1, 16, 16, 16384, 128, False), (1, 16, 16, 16384, 128, True),
]
QUICK = [FULL[2], FULL[3], FULL[4], FULL[6]]
REFERENCE_MAX_S = 4096  # the XLA reference materializes [B, N, S, S] in its backward


def time_ms(fn, args, iters, repeats):
  """Median milliseconds per call of ``fn(*args)`` over ``repeats`` runs of ``iters`` back-to-back calls."""
  out = fn(*args)
  jax.block_until_ready(out)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(iters):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) / iters)
  return statistics.median(times) * 1e3


def _flops(b, n, s, d, causal):
  f = 4 * b * n * s * s * d
  return f / 2 if causal else f


def bench_shape(b, n, kh, s, d, causal, iters, repeats):
  ks = jax.random.split(jax.random.key(s + d + n), 4)
  q = jax.random.normal(ks[0], (b, s, n, d), jnp.float32).astype(jnp.bfloat16)
  k = jax.random.normal(ks[1], (b, s, kh, d), jnp.float32).astype(jnp.bfloat16)
  v = jax.random.normal(ks[2], (b, s, kh, d), jnp.float32).astype(jnp.bfloat16)
  do = jax.random.normal(ks[3], (b, s, n, d), jnp.float32).astype(jnp.bfloat16)
  row = dict(B=b, N=n, K=kh, S=s, D=d, causal=causal)

  def grad_of(attn):
    loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

  impls = {
      "jqat": lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="triton"),
      "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn"),
  }
  if s <= REFERENCE_MAX_S and b * n * s * s <= 16 * 4096 * 4096:
    impls["xla_ref"] = lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="xla")
  for name, attn in impls.items():
    try:
      row[f"{name}_fwd_ms"] = time_ms(jax.jit(attn), (q, k, v), iters, repeats)
      row[f"{name}_fwdbwd_ms"] = time_ms(grad_of(attn), (q, k, v), iters, repeats)
    except Exception as e:  # e.g. cuDNN refusing a configuration: say so, keep going
      row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
  # The backward alone, from saved residuals.
  fwd = jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, is_causal=causal, implementation="triton"))
  _, o_hp, lse = fwd(q, k, v)
  bwd = jax.jit(lambda do, q, k, v, o, l: jqat.attention_backward(do, q, k, v, o, l, is_causal=causal,
                                                                    implementation="triton"))
  row["jqat_bwd_ms"] = time_ms(bwd, (do, q, k, v, o_hp, lse), iters, repeats)
  fl = _flops(b, n, s, d, causal)
  row["jqat_fwd_tflops"] = fl / row["jqat_fwd_ms"] / 1e9
  row["jqat_bwd_tflops"] = 2.5 * fl / row["jqat_bwd_ms"] / 1e9
  if "cudnn_fwdbwd_ms" in row:
    row["ratio_fwd_vs_cudnn"] = row["jqat_fwd_ms"] / row["cudnn_fwd_ms"]
    row["ratio_fwdbwd_vs_cudnn"] = row["jqat_fwdbwd_ms"] / row["cudnn_fwdbwd_ms"]
  stats = jax.devices()[0].memory_stats() or {}
  row["peak_gpu_bytes_so_far"] = stats.get("peak_bytes_in_use")
  return row


def memory_check(b=1, n=8, s=65536, d=128):
  """O(N) memory: fwd+bwd at a length where any [S, S] buffer would need >= 17 GB per head."""
  ks = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(kk, (b, s, n, d), jnp.float32).astype(jnp.bfloat16) for kk in ks)
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, is_causal=True, implementation="triton").astype(jnp.float32))
  g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  t0 = time.perf_counter()
  out = g(q, k, v)
  jax.block_until_ready(out)
  finite = all(bool(jnp.isfinite(x.astype(jnp.float32)).all()) for x in out)
  stats = jax.devices()[0].memory_stats() or {}
  return dict(B=b, N=n, S=s, D=d, causal=True, seconds_incl_compile=time.perf_counter() - t0, finite=finite,
              peak_gpu_bytes=stats.get("peak_bytes_in_use"), inputs_bytes=3 * q.size * 2)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="attention.json")
  ap.add_argument("--shapes", choices=["quick", "full"], default="full")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--memory", action="store_true", help="also run the (1, 8, 65536, 128) O(N) memory check")
  args = ap.parse_args()
  rows = []
  result = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "rows": rows}

  def save():  # after every row: a run cut short keeps what it measured
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)

  hdr = (f"{'B':>2} {'N':>3} {'K':>3} {'S':>6} {'D':>4} {'causal':>6} | {'jqat fwd':>9} {'bwd':>8} {'fwd+bwd':>8} |"
         f" {'cuDNN fwd':>9} {'fwd+bwd':>8} | {'ratio f':>7} {'ratio fb':>8} | {'TF/s fwd':>8} {'bwd':>6} |"
         f" {'ref fb':>8}")
  print(hdr)
  for shape in (FULL if args.shapes == "full" else QUICK):
    r = bench_shape(*shape, args.iters, args.repeats)
    rows.append(r)
    g = lambda k, r=r: r.get(k, float("nan"))
    print(f"{r['B']:>2} {r['N']:>3} {r['K']:>3} {r['S']:>6} {r['D']:>4} {str(r['causal']):>6} | "
          f"{g('jqat_fwd_ms'):>9.3f} {g('jqat_bwd_ms'):>8.3f} {g('jqat_fwdbwd_ms'):>8.3f} | "
          f"{g('cudnn_fwd_ms'):>9.3f} {g('cudnn_fwdbwd_ms'):>8.3f} | {g('ratio_fwd_vs_cudnn'):>7.2f} "
          f"{g('ratio_fwdbwd_vs_cudnn'):>8.2f} | {g('jqat_fwd_tflops'):>8.0f} {g('jqat_bwd_tflops'):>6.0f} | "
          f"{g('xla_ref_fwdbwd_ms'):>8.2f}", flush=True)
    for key in [k for k in r if k.endswith("_error")]:
      print(f"   {key}: {r[key]}")
    save()
  if args.memory:
    result["memory_check"] = memory_check()
    print("memory check:", result["memory_check"])
    save()
  print("wrote", args.out)
  try:
    _plot(rows, os.path.splitext(args.out)[0] + ".png")
  except ImportError:
    print("matplotlib not installed: no plot")


def _plot(rows, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  labels = [f"{r['B']}x{r['N']}/{r['K']}x{r['S']}x{r['D']}{' c' if r['causal'] else ''}" for r in rows]
  x = range(len(rows))
  fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
  w = 0.4
  ax.bar([i - w / 2 for i in x], [r.get("jqat_fwdbwd_ms", 0) for r in rows], w, label="jqat QAT fwd+bwd")
  ax.bar([i + w / 2 for i in x], [r.get("cudnn_fwdbwd_ms", 0) for r in rows], w, label="cuDNN BF16 fwd+bwd")
  ax.set_xticks(list(x), labels, rotation=45, ha="right", fontsize=7)
  ax.set_ylabel("ms")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print("wrote", path)


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
