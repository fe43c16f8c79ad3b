"""Decode over a packed NVFP4 KV cache against cuDNN BF16 decode and jqat.attention on a BF16 cache (one GPU).

    python benchmarks/decode.py --out decode.json [--rows quick|full] [--tq 1,4] [--sweep]

Per shape (B, N, K, T, D), new tokens Tq in {1, 4} and layout (contiguous, paged), in one process:
- ``jqat.decode_attention`` (default splits; every cache full, kv_lengths = T) under ``jax.jit``;
- cuDNN: ``jax.nn.dot_product_attention(implementation="cudnn")`` on BF16 K, V of the same shape (Tq = 4 without
  a mask: cuDNN's causal mask is top-left);
- ``jqat.attention`` (the training kernels' forward) on the BF16 cache, Tq = 4 bottom-right causal;
- the write of Tq new tokens (``jqat.kv_cache_update``, donated);
- jqat's decode and cuDNN's again as the layers of one jitted model step (``STEP_LAYERS`` calls in one ``jax.jit``,
  each layer its own query and, where the copies allow, its own cache): the time per layer, as a serving loop that
  jits a whole decode step pays it (one dispatch from the host for all layers).
Bandwidth: the cache bytes a call reads (codes and scales of K and V over kv_lengths keys) per second, and that as a
share of the device's HBM bandwidth (datasheet: H100 3.35 TB/s, H200 4.8). Caches are cycled between copies
totalling at least 512 MB, so no call finds its cache in the 50 MB L2. Memory: bytes_in_use of the device before and
after allocating each cache (packed and BF16).
``split_vs_one``: relative Frobenius distance of O with the default splits from O with one split (the numerics of the
split walk, docs/NUMERICS.md). ``--sweep`` times launch configurations and split counts on two shapes.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import report

import jqat
from jqat.ffi import plan as plans
from jqat.ffi.options import default_num_splits

# HBM bandwidth by the vendor's datasheets (SXM parts), for the share of it a decode reads at.
HBM_TBPS = {"H100": 3.35, "H200": 4.8}


def hbm_tbps(device_kind: str) -> float | None:
  return next((v for k, v in HBM_TBPS.items() if k in device_kind), None)
ROWS = {"full": [(8, 32, 8, 32768, 128), (32, 32, 8, 8192, 128), (1, 32, 8, 131072, 128), (64, 8, 1, 4096, 128)],
        "quick": [(8, 32, 8, 32768, 128), (64, 8, 1, 4096, 128)]}
PAGE_SIZE = 64


def time_ms(fn, arg_sets, iters=50, repeats=5):
  """Median ms per call of ``fn(*args)`` cycling through ``arg_sets``, ``iters`` calls back to back per repeat."""
  jax.block_until_ready([fn(*a) for a in arg_sets])
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = None
    for i in range(iters):
      out = fn(*arg_sets[i % len(arg_sets)])
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) / iters)
  return statistics.median(times) * 1e3


STEP_LAYERS = 8


def step_ms(fn, qs, arg_sets):
  """Median ms per layer of one ``jax.jit`` step that calls ``fn(q, *args)`` once per query in ``qs``, the i-th
  with ``arg_sets[i % len(arg_sets)]`` (distinct queries: no two layers are the same computation)."""
  sets = [arg_sets[i % len(arg_sets)] for i in range(len(qs))]
  step = jax.jit(lambda qs, sets: [fn(q, *a) for q, a in zip(qs, sets)])
  return time_ms(step, [(qs, sets)], iters=20) / len(qs)


def layer_queries(q):
  keys = jax.random.split(jax.random.key(5), STEP_LAYERS)
  return [jax.random.normal(k, q.shape, q.dtype) for k in keys]


def in_use():
  return (jax.devices()[0].memory_stats() or {}).get("bytes_in_use", 0)


def bf16_cache(b, t, kh, d, seed):
  keys = jax.random.split(jax.random.key(seed), 2)
  return (jax.random.normal(keys[0], (b, t, kh, d), jnp.bfloat16), jax.random.normal(keys[1], (b, t, kh, d),
                                                                                      jnp.bfloat16))


def packed_cache(b, t, kh, d, seed, paged):
  """Full K, V caches (random BF16 values quantized in) and, paged, a shuffled page table (else None)."""
  k, v = bf16_cache(b, t, kh, d, seed)
  kc, vc = jqat.nvfp4.quantize(k), jqat.nvfp4.quantize(v)
  del k, v
  table = None
  if paged:
    pages = t // PAGE_SIZE
    order = jnp.asarray(np.random.default_rng(seed).permutation(b * pages).reshape(b, pages), jnp.int32)
    inv = jnp.argsort(order.reshape(-1))
    to_pool = lambda x: x.reshape((b * pages, PAGE_SIZE) + x.shape[2:])[inv]
    kc, vc = tuple(map(to_pool, kc)), tuple(map(to_pool, vc))
    table = order
  jax.block_until_ready((kc, vc))
  return kc, vc, table


@jax.jit
def _exact(q, k, v, tq):
  b, _, n, d = q.shape
  kh = k.shape[2]
  s = jnp.einsum("bqkgd,btkd->bkgqt", q.astype(jnp.float32).reshape(b, -1, kh, n // kh, d), k,
                 precision=jax.lax.Precision.HIGHEST) * d ** -0.5
  t = k.shape[1]
  s = jnp.where(jnp.arange(t)[None, :] <= t - tq + jnp.arange(q.shape[1])[:, None], s, -jnp.inf)
  o = jnp.einsum("bkgqt,btkd->bqkgd", jax.nn.softmax(s, axis=-1), v, precision=jax.lax.Precision.HIGHEST)
  return o.reshape(q.shape)


def exact_attention(q, kc, vc, table, tq):
  """Softmax attention in FP32 without any rounding of P or Q, on the cache's own (dequantized) values: what O
  approximates, for scale against ``split_vs_one``."""
  from jqat._src.decode_reference import gather  # noqa: PLC0415

  return _exact(q, gather(*kc, table), gather(*vc, table), tq)


def bench_row(b, n, kh, t, d, tq, paged, copies_bytes=512 << 20):
  row = dict(B=b, N=n, K=kh, T=t, D=d, Tq=tq, paged=paged, page_size=PAGE_SIZE if paged else None)
  packed_bytes = b * t * kh * (d // 2 + d // 16) * 2
  bf16_bytes = b * t * kh * d * 2 * 2
  copies = max(1, math.ceil(copies_bytes / packed_bytes))
  base = in_use()
  caches = [packed_cache(b, t, kh, d, s, paged) for s in range(copies)]
  row["packed_cache_bytes_measured"] = (in_use() - base) / copies
  row["packed_cache_bytes"] = packed_bytes
  q = jax.random.normal(jax.random.key(99), (b, tq, n, d), jnp.bfloat16)
  lengths = jnp.full((b,), t, jnp.int32)
  layer_qs = layer_queries(q)  # the queries of the jitted step's layers, jqat's and cuDNN's alike
  splits = default_num_splits(b, kh, t, 64)
  row["num_splits"] = splits
  # The lengths are an argument, as in a serving loop (a constant array would be materialized by a launch per call).
  dec = jax.jit(lambda q, kc, vc, tb, lengths: jqat.decode_attention(q, kc, vc, lengths, page_table=tb,
                                                                     implementation="triton"))
  row["jqat_decode_ms"] = time_ms(dec, [(q, kc, vc, tb, lengths) for kc, vc, tb in caches])
  row["jqat_decode_tbps"] = packed_bytes / row["jqat_decode_ms"] / 1e9
  row["jqat_decode_step_ms"] = step_ms(dec, layer_qs, [(kc, vc, tb, lengths) for kc, vc, tb in caches])
  peak = hbm_tbps(getattr(jax.devices()[0], "device_kind", ""))
  row["hbm_share"] = row["jqat_decode_tbps"] / peak if peak else None
  one = jqat.decode_attention(q, *caches[0][:2], lengths, page_table=caches[0][2], num_splits=1,
                              implementation="triton")
  many = dec(q, *caches[0], lengths)
  o1, o2 = (np.asarray(x, np.float64) for x in (one, many))
  row["split_vs_one"] = float(np.linalg.norm(o2 - o1) / np.linalg.norm(o1))
  exact = np.asarray(exact_attention(q, *caches[0], tq), np.float64)  # FP32 softmax on the cache's values
  row["one_vs_exact"] = float(np.linalg.norm(o1 - exact) / np.linalg.norm(exact))
  row["split_vs_exact"] = float(np.linalg.norm(o2 - exact) / np.linalg.norm(exact))
  xla = jqat.decode_attention(q, *caches[0][:2], lengths, page_table=caches[0][2], num_splits=splits,
                              implementation="xla") if b * t <= 8 * 32768 else None
  if xla is not None:
    row["kernel_vs_xla"] = float(np.linalg.norm(o2 - np.asarray(xla, np.float64)) / np.linalg.norm(o1))
  # The write of Tq new tokens into the first cache (donated: in place).
  new = jax.random.normal(jax.random.key(7), (b, tq, kh, d), jnp.bfloat16)
  pos = jnp.full((b, tq), t - tq, jnp.int32) + jnp.arange(tq, dtype=jnp.int32)
  write = jax.jit(lambda kc, vc, tb: jqat.kv_cache_update(kc, vc, new, new, pos, page_table=tb,
                                                          implementation="triton"), donate_argnums=(0, 1))
  kc, vc, tb = caches[0]
  for _ in range(3):
    kc, vc = write(kc, vc, tb)
  jax.block_until_ready(kc)
  t0 = time.perf_counter()
  for _ in range(50):
    kc, vc = write(kc, vc, tb)
  jax.block_until_ready(kc)
  row["jqat_write_ms"] = (time.perf_counter() - t0) / 50 * 1e3
  del caches, kc, vc
  if not paged:  # the BF16 baselines, once per (shape, Tq)
    base = in_use()
    bf = [bf16_cache(b, t, kh, d, s) for s in range(max(1, math.ceil(copies_bytes / bf16_bytes)))]
    jax.block_until_ready(bf)
    row["bf16_cache_bytes_measured"] = (in_use() - base) / len(bf)
    cudnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"))
    train = jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=tq > 1, causal_alignment="bottom_right",
                                                   implementation="triton"))
    for name, fn in (("cudnn", cudnn), ("jqat_attention", train)):
      try:
        row[f"{name}_ms"] = time_ms(fn, [(q, k, v) for k, v in bf])
        if name == "cudnn":
          row["cudnn_step_ms"] = step_ms(fn, layer_qs, bf)
      except Exception as e:  # noqa: BLE001  (a refused configuration: this column only)
        row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    del bf
  return row


def sweep(rows):
  """Launch configurations and split counts of the decode kernel on ``rows`` (contiguous, Tq = 1)."""
  out = []
  for b, n, kh, t, d in rows:
    kc, vc, _ = packed_cache(b, t, kh, d, 0, False)
    q = jax.random.normal(jax.random.key(1), (b, 1, n, d), jnp.bfloat16)
    lengths = jnp.full((b,), t, jnp.int32)
    default = default_num_splits(b, kh, t, 64)
    configs = [(default, w, s, c) for w in (2, 4) for s in (2, 3) for c in (0, 1)]
    configs += [(max(1, default // 2), 2, 2, 1), (min(64, default * 2), 2, 2, 1)]
    for splits, warps, stages, cvt in configs:
      plans.set_config_override("decode", dict(num_warps=warps, num_stages=stages, cvt=cvt))
      fn = jax.jit(lambda q, kc, vc, n, s=splits: jqat.decode_attention(q, kc, vc, n, num_splits=s,
                                                                      implementation="triton"))
      try:
        ms = time_ms(fn, [(q, kc, vc, lengths)])
        out.append(dict(B=b, N=n, K=kh, T=t, D=d, splits=splits, num_warps=warps, num_stages=stages, cvt=cvt, ms=ms,
                        tbps=b * t * kh * (d // 2 + d // 16) * 2 / ms / 1e9))
      except Exception as e:  # noqa: BLE001
        out.append(dict(B=b, T=t, splits=splits, num_warps=warps, num_stages=stages, cvt=cvt, error=str(e)[:200]))
      print(out[-1], flush=True)
    plans.set_config_override("decode", None)
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="decode.json")
  ap.add_argument("--rows", choices=sorted(ROWS), default="full")
  ap.add_argument("--tq", default="1,4", help="new tokens per sequence, comma-separated")
  ap.add_argument("--sweep", action="store_true")
  args = ap.parse_args()
  tqs = [int(x) for x in args.tq.split(",")]
  dev = jax.devices()[0]
  result = {"benchmark": "decode", "command": f"python benchmarks/decode.py --rows {args.rows}"
             + (f" --tq {args.tq}" if tqs != [1, 4] else "") + (" --sweep" if args.sweep else ""),
      "date": time.strftime("%Y-%m-%d"), "device": getattr(dev, "device_kind", str(dev)),
      "hbm_tbps": hbm_tbps(getattr(dev, "device_kind", "")),
      "jax": jax.__version__, "python": platform.python_version(),
      "step_layers": STEP_LAYERS, "rows": []}
  if args.sweep:
    result["sweep"] = sweep(ROWS["quick"])
  for shape in ROWS[args.rows]:
    for tq in tqs:
      for paged in (False, True):
        row = bench_row(*shape, tq, paged)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
          json.dump(result, f, indent=1)
  print("\n".join(report.decode(result)))


if __name__ == "__main__":
  main()
