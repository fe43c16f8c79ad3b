"""JAX bindings of the NVFP4 QAT attention kernels (``kernels_triton/attention_{fwd,bwd}.py``).

Each entry point is a jit-able function of JAX arrays that launches the Triton
kernels through :func:`ffi.triton_call.triton_call`. jax-triton's primitive has
no batching rule, so every entry point is a ``jax.custom_batching.custom_vmap``
whose rule folds the vmapped axis into the batch axis B (all operands lead
with B, lse included), which is exactly a larger batch for the kernels.

Arrays are XLA buffers: row-major, so strides follow from the shapes, and
16-byte aligned, as jax-triton assumes.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import triton

from ffi.triton_call import triton_call
from kernels_triton import attention_bwd as kbwd
from kernels_triton import attention_fwd as kfwd
from kernels_triton import nvfp4 as knv


@functools.lru_cache(maxsize=None)
def _quant_flags() -> dict:
  dev = jax.devices()[0]
  return knv.quant_flags(getattr(dev, "compute_capability", None))


_FWD_KEYS = ("BLOCK_M", "num_warps", "num_stages")
_BWD_KEYS = ("DQ_BLOCK_M", "DQ_BLOCK_N", "KV_BLOCK_N", "KV_BLOCK_M", "num_warps", "num_stages", "DQ_num_warps",
             "DQ_num_stages")

# Process-wide launch-configuration overrides (for sweeps); see :func:`set_config_override`.
_OVERRIDES = {"fwd": {}, "bwd": {}}


def parse_config(text: str, allowed) -> dict:
  """``"BLOCK_M=64,num_warps=4"`` -> ``{"BLOCK_M": 64, "num_warps": 4}``; keys must be in ``allowed``."""
  out = {}
  for item in filter(None, (t.strip() for t in (text or "").split(","))):
    key, _, val = item.partition("=")
    key = key.strip()
    if key not in allowed:
      raise ValueError(f"unknown launch-config key {key!r}; expected one of {allowed}")
    out[key] = int(val)
  return out


def set_config_override(kind: str, config=None) -> None:
  """Overrides the launch configuration of the ``"fwd"`` or ``"bwd"`` kernels for every head dim.

  config: a dict or a ``"KEY=int,..."`` string (None or empty clears it). It is
  merged over the environment variable (``JQAT_ATTN_FWD_CONFIG`` /
  ``JQAT_ATTN_BWD_CONFIG``, same syntax) and over the built-in defaults. Keys:
  fwd: BLOCK_M, num_warps, num_stages; bwd: DQ_BLOCK_M, DQ_BLOCK_N, KV_BLOCK_N,
  KV_BLOCK_M, num_warps, num_stages (the dK/dV kernel; also the dQ kernel's
  unless DQ_num_warps / DQ_num_stages are given). Block sizes must keep the kernels' constraints (powers of two,
  KV_BLOCK_N % 16 == 0). The forward's BLOCK_N is ``block_n`` (it changes the
  function computed) and cannot be overridden here. Takes effect for functions
  traced afterwards (jit caches keep their compiled kernels).
  """
  allowed = _FWD_KEYS if kind == "fwd" else _BWD_KEYS
  _OVERRIDES[kind] = dict(config) if isinstance(config, dict) else parse_config(config, allowed)
  for key in _OVERRIDES[kind]:
    if key not in allowed:
      raise ValueError(f"unknown launch-config key {key!r}; expected one of {allowed}")
  _forward_fn.cache_clear()
  _backward_fn.cache_clear()


def _config(kind: str, default: dict) -> dict:
  env = "JQAT_ATTN_FWD_CONFIG" if kind == "fwd" else "JQAT_ATTN_BWD_CONFIG"
  cfg = dict(default)
  for over in (parse_config(os.environ.get(env, ""), _FWD_KEYS if kind == "fwd" else _BWD_KEYS),
               _OVERRIDES[kind]):
    over = dict(over)
    if kind == "bwd":  # num_warps / num_stages alone set both backward kernels
      for key in ("num_warps", "num_stages"):
        if key in over and "DQ_" + key not in over:
          over["DQ_" + key] = over[key]
    cfg.update(over)
  return cfg


def _strides(shape) -> tuple[int, ...]:
  """Row-major element strides of ``shape``."""
  return tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))


def fold_batch(fun, num_args: int):
  """``custom_vmap`` of ``fun(*arrays) -> tuple of arrays`` whose every array leads with B.

  Under vmap the mapped axis (moved to the front by JAX) is merged into B:
  ``[V, B, ...] -> [V * B, ...]``; unbatched operands are broadcast first.
  """
  folded = jax.custom_batching.custom_vmap(fun)

  @folded.def_vmap
  def _rule(axis_size, in_batched, *args):
    assert len(args) == num_args
    flat = []
    for x, batched in zip(args, in_batched):
      if not batched:
        x = jnp.broadcast_to(x, (axis_size,) + x.shape)
      flat.append(x.reshape((axis_size * x.shape[1],) + x.shape[2:]))
    outs = folded(*flat)  # the same custom_vmap function, so nested vmaps fold again
    outs = tuple(o.reshape((axis_size, o.shape[0] // axis_size) + o.shape[1:]) for o in outs)
    return outs, tuple(True for _ in outs)

  return folded


def _fake_quantize(x):
  """fq(x) along the last axis; x: [..., D] with D % 16 == 0, same shape and dtype out."""
  d = x.shape[-1]
  rows = x.size // d
  grid, launch = kfwd.fake_quantize_launch(rows, d)
  out = triton_call(
      x.reshape(rows, d), rows, d, d, d,
      kernel=kfwd.fake_quantize_rows_kernel, out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
      grid=grid, name="jqat_nvfp4_fake_quantize", **launch, **_quant_flags())
  return out.reshape(x.shape)


def _forward_impl(q, k, v, *, scale, is_causal, block_n, quantize_qkv, quantize_p):
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  out_shape = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((b, n, tq), jnp.float32))
  if q.size == 0 or k.size == 0:  # no rows, or no keys: O = O' = 0 and lse = -inf, nothing to launch
    return (jnp.zeros(q.shape, q.dtype), jnp.zeros(q.shape, q.dtype), jnp.full((b, n, tq), -jnp.inf, jnp.float32))
  if quantize_qkv:
    k, v = _fake_quantize(k), _fake_quantize(v)
  cfg = _config("fwd", kfwd.launch_config(d))
  sq, sk = _strides(q.shape), _strides(k.shape)
  return tuple(triton_call(
      q, k, v, float(scale), tq, tk, n, n // kh, *sq[:3], *sk[:3], *sk[:3], *sq[:3],
      kernel=kfwd.attention_fwd_kernel, out_shape=out_shape,
      grid=(triton.cdiv(tq, cfg["BLOCK_M"]), b * n), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
      name="jqat_attention_fwd", HEAD_DIM=d, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, IS_CAUSAL=is_causal,
      QUANTIZE_Q=quantize_qkv, QUANTIZE_P=quantize_p, **kfwd.dot_flags(q.dtype.name), **_quant_flags()))


def _backward_impl(do, q, k, v, o_for_delta, lse, *, scale, is_causal, quantize_qkv, quantize_p_backward):
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  if q.size == 0 or k.size == 0:  # nothing to launch: every gradient is an empty sum
    return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)
  if quantize_qkv:
    q, k, v = _fake_quantize(q), _fake_quantize(k), _fake_quantize(v)
  cfg = _config("bwd", kbwd.launch_config(d))
  sq, sk = _strides(q.shape), _strides(k.shape)
  delta = triton_call(
      o_for_delta, do, tq, n, *sq[:3], *sq[:3],
      kernel=kbwd.attention_bwd_delta_kernel, out_shape=jax.ShapeDtypeStruct((b, n, tq), jnp.float32),
      grid=(triton.cdiv(tq, kbwd.DELTA_LAUNCH["BLOCK_M"]), b * n), name="jqat_attention_bwd_delta",
      HEAD_DIM=d, **kbwd.DELTA_LAUNCH)
  common = (q, k, v, do, lse, delta, float(scale), tq, tk, n, n // kh, *sq[:3], *sk[:3], *sk[:3], *sq[:3])
  flags = dict(HEAD_DIM=d, IS_CAUSAL=is_causal, **kfwd.dot_flags(q.dtype.name))
  dq = triton_call(
      *common, kernel=kbwd.attention_bwd_dq_kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      grid=(triton.cdiv(tq, cfg["DQ_BLOCK_M"]), b * n), num_warps=cfg["DQ_num_warps"],
      num_stages=cfg["DQ_num_stages"],
      name="jqat_attention_bwd_dq", BLOCK_M=cfg["DQ_BLOCK_M"], BLOCK_N=cfg["DQ_BLOCK_N"], **flags)
  dk, dv = triton_call(
      *common, kernel=kbwd.attention_bwd_dkdv_kernel,
      out_shape=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
      grid=(triton.cdiv(tk, cfg["KV_BLOCK_N"]), b * kh), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
      name="jqat_attention_bwd_dkdv", BLOCK_M=cfg["KV_BLOCK_M"], BLOCK_N=cfg["KV_BLOCK_N"],
      QUANTIZE_P=quantize_p_backward, **flags, **_quant_flags())
  return dq, dk, dv


@functools.lru_cache(maxsize=None)
def _forward_fn(**static):
  return fold_batch(functools.partial(_forward_impl, **static), 3)


@functools.lru_cache(maxsize=None)
def _backward_fn(**static):
  return fold_batch(functools.partial(_backward_impl, **static), 6)


def attention_forward(query, key, value, *, scale: float, is_causal: bool, block_n: int, quantize_qkv: bool,
                      quantize_p: bool):
  """QAT forward on the GPU: ``(O, O', lse)``.

  query: [B, Tq, N, D]; key, value: [B, Tk, K, D] (N % K == 0, D % 16 == 0), one float dtype.
  Returns O, O' [B, Tq, N, D] in the query dtype and lse [B, N, Tq] fp32.
  """
  fn = _forward_fn(scale=float(scale), is_causal=bool(is_causal), block_n=int(block_n),
                   quantize_qkv=bool(quantize_qkv), quantize_p=bool(quantize_p))
  return fn(query, key, value)


def attention_backward(d_out, query, key, value, out_for_delta, lse, *, scale: float, is_causal: bool,
                       quantize_qkv: bool, quantize_p_backward: bool):
  """QAT backward on the GPU: ``(dQ, dK, dV)`` in the dtypes of query, key, value.

  d_out, out_for_delta: [B, Tq, N, D]; query [B, Tq, N, D]; key, value [B, Tk, K, D];
  lse: [B, N, Tq] fp32 from :func:`attention_forward`.
  """
  fn = _backward_fn(scale=float(scale), is_causal=bool(is_causal), quantize_qkv=bool(quantize_qkv),
                    quantize_p_backward=bool(quantize_p_backward))
  return fn(d_out, query, key, value, out_for_delta, lse)
