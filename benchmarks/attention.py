"""QAT attention on the GPU, in one process: jqat (Triton, every QAT switch on) vs cuDNN BF16, torch SDPA BF16,
FastVideo's Triton Attn-QAT training kernels (paper flags) and the XLA reference.

  python benchmarks/attention.py --out attention.json [--shapes quick|full] [--rows all|0,3,...] [--memory]
      [--fastvideo-sdist PATH] [--fastvideo-sha256 HEX] [--fastvideo-shapes all|none|0,3,...]
  python benchmarks/attention.py --memory-only --out memory.json

Times are medians over repeats of ``iters`` back-to-back calls, synchronized at
the end (JAX dispatch is asynchronous, so launch overhead is hidden behind the
previous call); torch SDPA and FastVideo use CUDA events around the same loop
(benchmarks/_timing.py), after one warm-up call (FastVideo compiles in it).
TFLOP/s counts 4*B*N*Tq*Tk*D for the forward and 2.5x that for the backward,
halved for causal. fwd+bwd is ``jax.grad`` through ``jqat.attention`` (forward
with residuals, then backward); for torch, ``torch.autograd.grad`` of a fresh
forward; torch forwards run under ``torch.no_grad``. FastVideo comes from the
``fastvideo-kernel`` sdist at run time (benchmarks/fastvideo.py; default
``.device/fastvideo_kernel-*.tar.gz``); without it, or on any failure, or for
GQA (unsupported there), its column prints "-" and the reason.

Memory (issue #13 item 4, ``--memory-only``): ``jax.value_and_grad`` through causal (1, 8, 65536, 128)
jqat attention, its measured peak (``peak_bytes_in_use``) against inputs + outputs + residuals, with every
buffer of the forward and backward listed from the launch plans (:func:`memory_accounting`).
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
from _figure import pyplot, save  # noqa: E402
from _timing import cuda_event_ms  # noqa: E402

# (B, N, K, S, D, causal): issue #13's eight shapes, then a head dim that is no power of two (padded tiles)
FULL = [
  (1, 16, 16, 4096, 128, False),
  (1, 16, 16, 4096, 128, True),
  (1, 16, 16, 16384, 128, False),
  (1, 16, 16, 16384, 128, True),
  (2, 16, 16, 4096, 64, False),
  (1, 40, 40, 9360, 128, False),  # a video shape (Wan-like token count)
  (1, 32, 8, 8192, 128, True),  # GQA
  (8, 16, 16, 1024, 128, True),
  (1, 16, 16, 8192, 96, False),
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


MEMORY_SHAPE = (1, 8, 65536, 128)  # (B, N, S, D), causal: issue #13 item 4
MEMORY_BUDGET = 1.2  # peak within 1.2x of inputs + outputs + residuals
# What would remove a backward transient, by buffer (the sizes come from the plans; these are the reasons).
_REMEDIES = {
  "fq copies": "fq(Q), fq(K), fq(V) are written by fake-quantize launches before the dQ and dK/dV kernels; "
  "quantizing each tile as those kernels load it (as the forward kernel already does for Q: QUANTIZE_Q) removes "
  "them",
  "do": "the cotangent of sum(O): a broadcast of ones that XLA materializes because a custom call takes buffers; "
  "a training loss's dO is a real array, part of the caller's graph",
  "delta": "rowsum(O' * dO), computed by its own launch; the dQ kernel could compute it per query block",
}


def _buffer(name, t):
  return dict(name=name, shape=list(t.shape), dtype=t.dtype, bytes=t.size * jnp.dtype(t.dtype).itemsize)


def _total(buffers):
  return sum(x["bytes"] for x in buffers)


def memory_accounting(b, n, s, d, causal=True, p_scale="block"):
  """What ``jax.value_and_grad`` of ``sum(jqat.attention(q, k, v))`` (Triton) holds on the GPU, buffer by buffer.

  Computed from the launch plans the Triton path executes (``jqat.ffi.plan``), not typed in. q, k, v:
  [b, s, n, d] bf16 (MHA). The custom VJP saves (q, k, v, O', lse[, row_max]) (jqat/_src/attention.py).
  Returns a dict of buffer lists (each ``{name, shape, dtype, bytes}``):
    inputs: q, k, v; outputs: the loss (f32 scalar) and dq, dk, dv; residuals: the saved forward outputs
    that are not inputs (O', lse, row_max with p_scale="row");
    forward_transients: the forward plan's scratch (fq(K), fq(V), and fq(Q) when causal or windowed) and O,
    which only the loss reads (jqat.attention's VJP keeps the forward's fq(K), fq(V) for the backward, where
    they become dk's and dv's storage: the same bytes, counted once, as outputs);
    backward_transients: dO (the cotangent XLA materializes for the backward's custom calls) and the
    backward plan's scratch (delta; fq(K), fq(V) live in dk's and dv's storage and fq(Q) in O''s, as the
    JAX binding plans it: ``backward_in_outputs``).
  and bytes: ``base`` = inputs + outputs + residuals; ``forward_peak`` (inputs, forward scratch and
  outputs, live at the forward kernel) and ``backward_peak`` (inputs, residuals, backward transients and
  outputs, all live at the last launch, dK/dV, which reads every scratch buffer); ``predicted_peak``, their
  max, and ``predicted_ratio`` = predicted_peak / base; ``without``: per group of backward transients
  (``_REMEDIES``), the backward peak and ratio without it, and why it exists.
  """
  from jqat.ffi import plan as plans  # noqa: PLC0415  (imports triton: only where the check runs)
  from jqat.ffi.options import AttentionOptions  # noqa: PLC0415

  opts = AttentionOptions(scale=d**-0.5, is_causal=causal, p_scale=p_scale)
  target = plans.Target(compute_capability=(9, 0))  # flags only; the buffers do not depend on the GPU
  x = plans.Tensor.dense((b, s, n, d), "bfloat16")
  fwd = plans.attention_forward(x, x, x, opts, target)
  res = [name for name in fwd.outputs if name != "o"]  # O is the primal output; the others are saved
  bwd = plans.attention_backward(
    fwd.buffers["o"], x, x, x, fwd.buffers["o_hp"], fwd.buffers["lse"], opts, target,
    row_max=fwd.buffers.get("row_max"), q_hat_over_out=True,  # as jqat/ffi/jax_launch.py plans it
  )
  acct = dict(
    shape=dict(B=b, N=n, S=s, D=d, causal=causal, p_scale=p_scale),
    inputs=[_buffer(name, fwd.buffers[name]) for name in fwd.inputs],
    outputs=[_buffer("loss", plans.Tensor.dense((), "float32"))] + [_buffer(o, bwd.buffers[o]) for o in bwd.outputs],
    residuals=[_buffer(name, fwd.buffers[name]) for name in res],
    forward_transients=[_buffer(name, fwd.buffers[name]) for name in fwd.scratch + ("o",)],
    backward_transients=[_buffer("do", bwd.buffers["do"])] + [_buffer(name, bwd.buffers[name]) for name in bwd.scratch],
    # In another buffer's storage (the plan's stored_in: dk, dv, and O' once delta is formed): no bytes of their own.
    backward_in_outputs=[dict(_buffer(name, bwd.buffers[name]), stored_in=out) for name, out in bwd.stored_in.items()],
  )
  base = _total(acct["inputs"]) + _total(acct["outputs"]) + _total(acct["residuals"])
  do_bytes = _total([t for t in acct["backward_transients"] if t["name"] == "do"])
  fwd_peak = _total(acct["inputs"]) + _total(acct["forward_transients"]) + _total(acct["residuals"])
  bwd_peak = base + _total(acct["backward_transients"])
  groups = {"fq copies": [t for t in acct["backward_transients"] if t["name"].endswith("_hat")]}
  groups.update({t["name"]: [t] for t in acct["backward_transients"] if not t["name"].endswith("_hat")})
  without = {}
  for group, bufs in groups.items():
    if bufs:
      peak = max(fwd_peak, bwd_peak - _total(bufs))
      without[group] = dict(
        names=[t["name"] for t in bufs],
        bytes=_total(bufs),
        predicted_peak=peak,
        ratio=peak / base,
        why=_REMEDIES.get(group, ""),
      )
  acct.update(
    base=base,
    forward_peak=fwd_peak,
    backward_peak=bwd_peak,
    predicted_peak=max(fwd_peak, bwd_peak),
    predicted_ratio=max(fwd_peak, bwd_peak) / base,
    # dO counted as an input (of the backward: the gradient that flows in) rather than as a transient.
    base_with_cotangent=base + do_bytes,
    predicted_ratio_with_cotangent=max(fwd_peak, bwd_peak) / (base + do_bytes),
    without=without,
  )
  return acct


def format_accounting(acct, budget=MEMORY_BUDGET):
  """The accounting of :func:`memory_accounting` as lines a person can read (MB = 1e6 bytes)."""
  mb = lambda v: f"{v / 1e6:10.2f} MB"
  lines = []
  for kind in ("inputs", "outputs", "residuals", "forward_transients", "backward_transients"):
    lines.append(f"{kind} ({mb(_total(acct[kind])).strip()}):")
    lines += [f"  {t['name']:<8} {str(tuple(t['shape'])):<22} {t['dtype']:<9} {mb(t['bytes'])}" for t in acct[kind]]
  base = acct["base"]
  lines.append(f"inputs + outputs + residuals: {mb(base).strip()}; budget {budget}x = {mb(budget * base).strip()}")
  for t in acct["backward_in_outputs"]:
    lines.append(f"  {t['name']:<8} lives in {t['stored_in']}'s storage (no bytes of its own)")
  lines.append(
    f"predicted peak: forward {mb(acct['forward_peak']).strip()}, backward {mb(acct['backward_peak']).strip()}"
    f" = {acct['predicted_ratio']:.3f}x ({acct['predicted_ratio_with_cotangent']:.3f}x with dO counted as an input:"
    f" {mb(acct['base_with_cotangent']).strip()})"
  )
  for group, w in acct["without"].items():
    verdict = "within" if w["ratio"] <= budget else "still over"
    lines.append(
      f"  without {group} ({', '.join(w['names'])}; {mb(w['bytes']).strip()}): {w['ratio']:.3f}x, {verdict} "
      f"{budget}x. {w['why']}"
    )
  return lines


def memory_check(shape=MEMORY_SHAPE, causal=True):
  """``jax.value_and_grad`` through causal jqat.attention at a length where any [S, S] buffer would need >= 17 GB
  per head: the measured peak (``peak_bytes_in_use``, meaningful in a process that ran nothing bigger before:
  ``--memory-only``), XLA's own buffer sizes for the program and the plan-based :func:`memory_accounting`."""
  b, n, s, d = shape
  acct = memory_accounting(b, n, s, d, causal)
  dev = jax.devices()[0]
  if dev.platform != "gpu":  # the accounting alone (a dry run): nothing to measure without the kernels
    return dict(accounting=acct, not_measured=f"the default JAX device is {dev.platform}, not a GPU")
  # bf16 straight from the generator, one array at a time: no f32 copy raises the peak before the check.
  make = jax.jit(lambda key: jax.random.normal(key, (b, s, n, d), jnp.bfloat16))
  q, k, v = (make(kk) for kk in jax.random.split(jax.random.key(0), 3))
  jax.block_until_ready((q, k, v))
  before = dev.memory_stats() or {}
  loss = lambda q, k, v: jnp.sum(jqat.attention(q, k, v, is_causal=causal, implementation="triton").astype(jnp.float32))
  t0 = time.perf_counter()
  compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
  value, grads = compiled(q, k, v)
  jax.block_until_ready(grads)
  seconds = time.perf_counter() - t0
  stats = dev.memory_stats() or {}
  xla = compiled.memory_analysis()
  xla_sizes = {
    key: getattr(xla, f"{key}_size_in_bytes", None) for key in ("argument", "output", "temp", "alias", "generated_code")
  }
  peak = stats.get("peak_bytes_in_use")
  return dict(
    accounting=acct,
    seconds_incl_compile=seconds,
    finite=bool(jnp.isfinite(value)) and all(bool(jnp.isfinite(g).all()) for g in grads),
    bytes_in_use_before=before.get("bytes_in_use"),
    peak_bytes_before=before.get("peak_bytes_in_use"),
    peak_bytes=peak,
    measured_ratio=None if peak is None else peak / acct["base"],
    measured_ratio_with_cotangent=None if peak is None else peak / acct["base_with_cotangent"],
    xla_memory_analysis=xla_sizes,
  )


def report_memory(m, budget=MEMORY_BUDGET):
  """Prints :func:`memory_check`'s result."""
  print("\n".join(format_accounting(m["accounting"], budget)))
  if "not_measured" in m:
    print("measured peak: -", m["not_measured"])
    return
  xla = m["xla_memory_analysis"]
  print(
    f"XLA buffer assignment: arguments {xla['argument']}, outputs {xla['output']}, temporaries {xla['temp']}, "
    f"aliased {xla['alias']} bytes"
  )
  print(f"before the call: {m['bytes_in_use_before']} bytes in use, peak so far {m['peak_bytes_before']}")
  if m["peak_bytes"] is None:
    print("measured peak: - (the device reports no memory_stats)")
  else:
    verdict = "within" if m["measured_ratio"] <= budget else "OVER"
    print(
      f"measured peak (peak_bytes_in_use): {m['peak_bytes'] / 1e6:.2f} MB = {m['measured_ratio']:.3f}x of inputs "
      f"+ outputs + residuals: {verdict} {budget}x ({m['measured_ratio_with_cotangent']:.3f}x with dO as an "
      f"input); gradients finite: {m['finite']}; "
      f"{m['seconds_incl_compile']:.1f} s incl. compile"
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


def _parse_indices(text, count, option="--fastvideo-shapes"):
  if text in ("all", "none"):
    return set(range(count)) if text == "all" else set()
  try:
    idx = {int(t) for t in text.split(",")}
  except ValueError:
    idx = None
  if idx is None or not idx <= set(range(count)):
    raise SystemExit(
      f"{option}: expected all, none or comma-separated row indices in [0, {count}), got {text!r}"
    )
  return idx


def _parse_memory_shape(text):
  try:
    shape = tuple(int(t) for t in text.split(","))
  except ValueError:
    shape = ()
  if len(shape) != 4 or min(shape) < 1 or shape[3] % 16:
    raise SystemExit(f"--memory-shape: expected B,N,S,D (positive integers, D % 16 == 0), got {text!r}")
  return shape


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
    help="full: issue #13's 8 shapes and one at D = 96; quick: 4 of them (incl. S = 16384 and GQA)",
  )
  ap.add_argument(
    "--rows",
    default="all",
    help="rows to run (0-based indices into the chosen shape list, comma-separated), default all; "
    "a row keeps its index in the table and the JSON",
  )
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument(
    "--memory",
    action="store_true",
    help="also run the (1, 8, 65536, 128) causal memory check after the rows (its peak then includes theirs)",
  )
  ap.add_argument(
    "--memory-only",
    action="store_true",
    help="run only the memory check, in a process that allocated nothing before it: the measured peak is its own",
  )
  ap.add_argument(
    "--memory-shape",
    default=",".join(map(str, MEMORY_SHAPE)),
    help="B,N,S,D of the memory check (causal, MHA); issue #13 asks for the default",
  )
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
    "the FastVideo column (each compiles its kernels on its first call)",
  )
  args = ap.parse_args()
  memory_shape = _parse_memory_shape(args.memory_shape)
  if args.memory_only:
    result = {
      "device": str(jax.devices()[0].device_kind),
      "jax": jax.__version__,
      "memory_check": memory_check(memory_shape),
    }
    report_memory(result["memory_check"])
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
    print("wrote", args.out)
    return
  shapes = FULL if args.shapes == "full" else QUICK
  fv_rows = _parse_indices(args.fastvideo_shapes, len(shapes))
  run_rows = _parse_indices(args.rows, len(shapes), "--rows")
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
      if i not in run_rows:
        continue
      fv_i = fv if i in fv_rows else "not requested (--fastvideo-shapes)"
      r = dict(row=i, **bench_shape(*shape, args.iters, args.repeats, sdpa=torch_ok, fv=fv_i))
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
    result["memory_check"] = dict(memory_check(memory_shape), peak_includes_earlier_rows=True)
    report_memory(result["memory_check"])
    print("(this peak includes the rows above; --memory-only measures the check alone)")
    save()
  print("wrote", args.out)
  _plot(rows, os.path.splitext(args.out)[0] + ".png")


def _plot(rows, path):
  plt = pyplot()
  if plt is None:
    return

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
  save(fig, path)


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
