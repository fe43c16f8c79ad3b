"""QAT attention on the GPU, in one process: jqat (Triton, every QAT switch on) vs cuDNN BF16, torch SDPA BF16,
FastVideo's Triton Attn-QAT training kernels (paper flags) and the XLA reference.

  python benchmarks/attention.py --out attention.json [--shapes quick|full] [--memory]
      [--fastvideo-sdist PATH] [--fastvideo-sha256 HEX] [--fastvideo-shapes all|none|0,3,...]

Times are medians over repeats of ``iters`` back-to-back calls, synchronized at
the end (JAX dispatch is asynchronous, so launch overhead is hidden behind the
previous call); torch SDPA and FastVideo use CUDA events around the same loop
(benchmarks/_timing.py), after one warm-up call (FastVideo autotunes in it).
TFLOP/s counts 4*B*N*Tq*Tk*D for the forward and 2.5x that for the backward,
halved for causal. fwd+bwd is ``jax.grad`` through ``jqat.attention`` (forward
with residuals, then backward); for torch, ``torch.autograd.grad`` of a fresh
forward; torch forwards run under ``torch.no_grad``. FastVideo comes from the
``fastvideo-kernel`` sdist at run time (benchmarks/fastvideo.py; default
``.device/fastvideo_kernel-*.tar.gz``); without it, or on any failure, or for
GQA (unsupported there), its column prints "-" and the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

# torch shares the GPU in this process: JAX must not take 75% of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

import jqat  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastvideo  # noqa: E402
from _timing import cuda_event_ms  # noqa: E402

# (B, N, K, S, D, causal): issue #13's shapes
FULL = [
  (1, 16, 16, 4096, 128, False),
  (1, 16, 16, 4096, 128, True),
  (1, 16, 16, 16384, 128, False),
  (1, 16, 16, 16384, 128, True),
  (2, 16, 16, 4096, 64, False),
  (1, 40, 40, 9360, 128, False),  # a video shape (Wan-like token count)
  (1, 32, 8, 8192, 128, True),  # GQA
  (8, 16, 16, 1024, 128, True),
]
QUICK = [FULL[0], FULL[3], FULL[4], FULL[6]]
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


def _error(e):
  return f"{type(e).__name__}: {str(e)[:200]}"


def _torch_columns(row, prefix, attn, shape, iters, repeats):
  """Adds ``{prefix}_fwd_ms`` and ``{prefix}_fwdbwd_ms`` for ``attn(q, k, v) -> [B, N, S, D]`` on BHSD bf16
  tensors (q: [B, N, S, D], k, v: [B, K, S, D]), or ``{prefix}_error``; never raises."""
  import torch

  b, n, kh, s, d, _ = shape
  try:
    g = torch.Generator(device="cuda").manual_seed(s + d + n)
    mk = lambda h: torch.randn((b, h, s, d), generator=g, device="cuda", dtype=torch.bfloat16)
    q, k, v = (mk(h).requires_grad_() for h in (n, kh, kh))
    do = mk(n)

    def fwd():
      with torch.no_grad():
        attn(q, k, v)

    row[f"{prefix}_fwd_ms"] = cuda_event_ms(fwd, iters, repeats)
    row[f"{prefix}_fwdbwd_ms"] = cuda_event_ms(
      lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), do), iters, repeats
    )
  except Exception as e:  # OOM, a compile failure, an unsupported shape: this column only
    row[f"{prefix}_error"] = _error(e)
  finally:
    q = k = v = do = None
    torch.cuda.empty_cache()


def torch_sdpa(causal, gqa):
  import torch

  return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def fastvideo_attention(module, causal, d):
  """FastVideo's Attn-QAT training attention with the paper's flags, as its benchmark_attn_qat_train.py calls it."""
  import torch

  warp_specialize = torch.cuda.get_device_capability()[0] != 12  # theirs: off on consumer Blackwell only
  return lambda q, k, v: module.attention(
    q,
    k,
    v,
    causal,
    d**-0.5,
    True,  # use_qat_qkv_backward
    False,  # smooth_k
    warp_specialize,
    True,  # IS_QAT
    False,  # two_level_quant_P
    True,  # fake_quant_P
    True,  # use_high_prec_o
    False,  # smooth_q
    False,  # use_global_sf_P
    False,  # use_global_sf_QKV
  )


def bench_shape(b, n, kh, s, d, causal, iters, repeats, sdpa=None, fv=None):
  """One row. ``sdpa``: True to time torch SDPA, else the reason it is absent; ``fv``: the FastVideo
  module, or the reason its column is absent."""
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
  bwd = jax.jit(
    lambda do, q, k, v, o, l: jqat.attention_backward(do, q, k, v, o, l, is_causal=causal, implementation="triton")
  )
  row["jqat_bwd_ms"] = time_ms(bwd, (do, q, k, v, o_hp, lse), iters, repeats)
  fl = _flops(b, n, s, d, causal)
  row["jqat_fwd_tflops"] = fl / row["jqat_fwd_ms"] / 1e9
  row["jqat_bwd_tflops"] = 2.5 * fl / row["jqat_bwd_ms"] / 1e9
  if "cudnn_fwdbwd_ms" in row:
    row["ratio_fwd_vs_cudnn"] = row["jqat_fwd_ms"] / row["cudnn_fwd_ms"]
    row["ratio_fwdbwd_vs_cudnn"] = row["jqat_fwdbwd_ms"] / row["cudnn_fwdbwd_ms"]
  stats = jax.devices()[0].memory_stats() or {}
  row["peak_gpu_bytes_so_far"] = stats.get("peak_bytes_in_use")
  shape = (b, n, kh, s, d, causal)
  if sdpa is True:
    _torch_columns(row, "sdpa", torch_sdpa(causal, kh != n), shape, iters, repeats)
  else:
    row["sdpa_error"] = sdpa
  if isinstance(fv, str):
    row["fastvideo_error"] = fv
  elif kh != n:
    row["fastvideo_error"] = "no GQA support in FastVideo's attn_qat_train"
  else:
    _torch_columns(row, "fastvideo", fastvideo_attention(fv, causal, d), shape, iters, repeats)
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
  return dict(
    B=b,
    N=n,
    S=s,
    D=d,
    causal=True,
    seconds_incl_compile=time.perf_counter() - t0,
    finite=finite,
    peak_gpu_bytes=stats.get("peak_bytes_in_use"),
    inputs_bytes=3 * q.size * 2,
  )


def _torch_status():
  """True when torch can run on a CUDA GPU here, else the reason it cannot."""
  try:
    import torch
  except Exception as e:  # not installed, or its CUDA libraries clash with JAX's
    return f"torch not importable: {_error(e)}"
  return True if torch.cuda.is_available() else "torch sees no CUDA GPU"


def _fastvideo_status(args, workdir, torch_ok):
  """The FastVideo module, or the reason its column is absent (never raises)."""
  if torch_ok is not True:
    return torch_ok
  sdist = args.fastvideo_sdist or fastvideo.default_sdist()
  if sdist is None:
    return f"no sdist: pass --fastvideo-sdist (default {fastvideo.DEFAULT_GLOB}, none found)"
  try:
    return fastvideo.load(sdist, workdir, args.fastvideo_sha256 or fastvideo.PINNED_SHA256)
  except Exception as e:  # a wrong hash, a changed layout, an import error
    return _error(e)


def _parse_indices(text, count):
  if text in ("all", "none"):
    return set(range(count)) if text == "all" else set()
  try:
    idx = {int(t) for t in text.split(",")}
  except ValueError:
    idx = None
  if idx is None or not idx <= set(range(count)):
    raise SystemExit(
      f"--fastvideo-shapes: expected all, none or comma-separated row indices in [0, {count}), got {text!r}"
    )
  return idx


def _ms(r, key):
  v = r.get(f"{key}_ms")
  return f"{v:.3f}" if v is not None else "-"


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="attention.json")
  ap.add_argument(
    "--shapes",
    choices=["quick", "full"],
    default="full",
    help="full: issue #13's 8 shapes; quick: 4 of them (incl. S = 16384 and GQA)",
  )
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--memory", action="store_true", help="also run the (1, 8, 65536, 128) O(N) memory check")
  ap.add_argument(
    "--fastvideo-sdist",
    default=None,
    help=f"fastvideo-kernel sdist (default: {fastvideo.DEFAULT_GLOB} if present, else no column)",
  )
  ap.add_argument(
    "--fastvideo-sha256",
    default=None,
    help=f"accept an sdist with this sha256 instead of the pinned 0.3.5 ({fastvideo.PINNED_SHA256})",
  )
  ap.add_argument(
    "--fastvideo-shapes",
    default="all",
    help="rows (0-based indices into the chosen shape list, comma-separated), all or none that get "
    "the FastVideo column (each autotunes on its first call)",
  )
  args = ap.parse_args()
  shapes = FULL if args.shapes == "full" else QUICK
  fv_rows = _parse_indices(args.fastvideo_shapes, len(shapes))
  rows = []
  result = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "rows": rows}
  torch_ok = _torch_status()
  if torch_ok is True:
    import torch

    result["torch"] = torch.__version__
  else:
    print("torch SDPA and FastVideo columns: -", torch_ok)

  def save():  # after every row: a run cut short keeps what it measured
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)

  with tempfile.TemporaryDirectory(prefix="fastvideo_kernel_") as workdir:
    fv = _fastvideo_status(args, workdir, torch_ok) if fv_rows else "not requested (--fastvideo-shapes none)"
    if isinstance(fv, str):
      print("FastVideo column: -", fv)
    else:
      result["fastvideo_sdist_sha256"] = args.fastvideo_sha256 or fastvideo.PINNED_SHA256
    hdr = (
      f"{'#':>1} {'B':>2} {'N':>3} {'K':>3} {'S':>6} {'D':>4} {'causal':>6} | {'jqat fwd':>9} {'bwd':>8}"
      f" {'fwd+bwd':>8} | {'cuDNN fwd':>9} {'fwd+bwd':>8} | {'ratio f':>7} {'ratio fb':>8} |"
      f" {'SDPA fwd':>8} {'fwd+bwd':>8} | {'FV fwd':>8} {'fwd+bwd':>8} | {'TF/s fwd':>8} {'bwd':>6}"
    )
    print(hdr)
    for i, shape in enumerate(shapes):
      fv_i = fv if i in fv_rows else "not requested (--fastvideo-shapes)"
      r = bench_shape(*shape, args.iters, args.repeats, sdpa=torch_ok, fv=fv_i)
      rows.append(r)
      g = lambda k, r=r: r.get(k, float("nan"))
      print(
        f"{i:>1} {r['B']:>2} {r['N']:>3} {r['K']:>3} {r['S']:>6} {r['D']:>4} {str(r['causal']):>6} | "
        f"{_ms(r, 'jqat_fwd'):>9} {_ms(r, 'jqat_bwd'):>8} {_ms(r, 'jqat_fwdbwd'):>8} | "
        f"{_ms(r, 'cudnn_fwd'):>9} {_ms(r, 'cudnn_fwdbwd'):>8} | {g('ratio_fwd_vs_cudnn'):>7.2f} "
        f"{g('ratio_fwdbwd_vs_cudnn'):>8.2f} | {_ms(r, 'sdpa_fwd'):>8} {_ms(r, 'sdpa_fwdbwd'):>8} | "
        f"{_ms(r, 'fastvideo_fwd'):>8} {_ms(r, 'fastvideo_fwdbwd'):>8} | {g('jqat_fwd_tflops'):>8.0f} "
        f"{g('jqat_bwd_tflops'):>6.0f}",
        flush=True,
      )
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
  series = [("jqat", "jqat QAT"), ("cudnn", "cuDNN BF16"), ("sdpa", "torch SDPA BF16"), ("fastvideo", "FastVideo QAT")]
  fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.2), 4))
  w = 0.8 / len(series)
  for j, (key, name) in enumerate(series):
    xs = [i + (j - (len(series) - 1) / 2) * w for i in range(len(rows))]
    # A missing measurement is a missing bar (nan), not a zero-height one that reads as "instant".
    ax.bar(xs, [r.get(f"{key}_fwdbwd_ms", float("nan")) for r in rows], w, label=f"{name} fwd+bwd")
  ax.set_xticks(list(range(len(rows))), labels, rotation=45, ha="right", fontsize=7)
  ax.set_ylabel("ms (log)")
  ax.set_yscale("log")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print("wrote", path)


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
