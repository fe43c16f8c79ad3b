"""Serving on torch tensors: the packed NVFP4 KV cache write and decode attention (docs/NUMERICS.md, section 10).

The cache layout is the JAX API's (``jqat.kv_cache_update``): per tensor ``(codes uint8 [B, T, K, D // 2],
scales float8_e4m3fn [B, T, K, D // 16])``, or paged ``[num_pages, page_size, K, ..]`` with ``page_table int32
[B, pages_per_seq]``. Queries, new keys and values and the output are BHSD, as everywhere in ``jqat.torch``:
``q [B, N, Tq, D]``, ``k_new, v_new [B, K, Tn, D]``.

CUDA tensors execute the launch plans of ``jqat.ffi.plan`` (the kernels the JAX API runs inside XLA) on torch's
current stream. A plan is built once per shape and reused; nothing synchronizes with the host, and after the first
call for a shape nothing compiles, so both ops can be captured in a CUDA graph (their scratch comes from torch's
caching allocator, which a capture serves from the graph's pool). CPU tensors go through DLPack to the XLA path.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import torch

from jqat._src import decode as _api
from jqat._src import validate
from jqat.ffi.options import DEFAULT_BLOCK_N, check_block_n, default_num_splits
from jqat.torch import _tensors as tt


def _launcher():
  from jqat.ffi import plan as plans  # noqa: PLC0415  (imports triton; only needed on CUDA)
  from jqat.ffi import torch_launch  # noqa: PLC0415

  return plans, torch_launch


def _check(name, t, device):
  tt.check_tensor(name, t)
  tt.check_device(name, t, device)
  if t.dim() and t.stride(-1) != 1:
    raise NotImplementedError(f"{name} must have a contiguous last axis, got strides {tuple(t.stride())}")


def _check_cache(k_cache, v_cache, page_table, device):
  for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
    if isinstance(cache, (tuple, list)) and len(cache) == 2:
      _check(f"{name} codes", cache[0], device)
      _check(f"{name} scales", cache[1], device)
  if page_table is not None:
    _check("page_table", page_table, device)
    if page_table.dtype != torch.int32:
      raise ValueError(f"page_table must be int32, got {page_table.dtype}")


def _cpu_values(t):
  """``t`` for DLPack into JAX: float8 as its bytes (DLPack has no E4M3 type), viewed back on the JAX side."""
  return tt.to_jax(t.view(torch.uint8)) if t.dtype == torch.float8_e4m3fn else tt.to_jax(t)


def _jax_cache(cache):
  return (_cpu_values(cache[0]), jax.lax.bitcast_convert_type(_cpu_values(cache[1]), jnp.float8_e4m3fn))


@functools.cache
def _decode_plan(descriptions, opts, target, paged: bool, out_strides, kernel: str | None):
  plans, _ = _launcher()
  q, kc, ks, vc, vs, kv_len, *table = descriptions
  return plans.decode_attention(q, kc, ks, vc, vs, kv_len, opts, target, page_table=table[0] if paged else None,
                                out_strides=out_strides, kernel=kernel)


def decode_attention(q, k_cache, v_cache, kv_lengths, *, page_table=None, scale=None, is_causal=True,
                     num_splits=None, block_n=DEFAULT_BLOCK_N, quantize_qkv=True, quantize_p=True, p_scale="block",
                     out=None):
  """Decode attention over packed caches (``jqat.decode_attention``'s function): BHSD ``q [B, N, Tq, D]``
  (1 <= Tq <= 64), ``kv_lengths int32 [B]`` (the new tokens already written). Returns ``out`` (or a new
  contiguous BHSD tensor) ``[B, N, Tq, D]`` in q's dtype; an ``out`` given must be dense, of q's shape, dtype and
  device, and alias no input. On CUDA the lengths and the page table are not read by
  the host (out-of-range values are clamped by the kernel; see ``jqat.decode_attention``)."""
  tt.check_tensor("q", q)
  tt.check_backend(q.device)
  validate.attention_inputs(q, q, q, layout="BHSD", names=("q", "q", "q"))
  b, n, tq, d = q.shape
  _check_cache(k_cache, v_cache, page_table, q.device)
  _check("kv_lengths", kv_lengths, q.device)
  if kv_lengths.dtype != torch.int32:
    raise ValueError(f"kv_lengths must be int32, got {kv_lengths.dtype}")
  if tuple(kv_lengths.shape) != (b,):
    raise ValueError(f"kv_lengths must have shape {(b,)} [B], got {tuple(kv_lengths.shape)}")
  if not 1 <= tq <= _api.MAX_NEW_TOKENS:
    raise ValueError(f"q must hold 1 to {_api.MAX_NEW_TOKENS} new tokens per sequence (axis 2), got {tq}")
  layout = _api.cache_layout(k_cache, v_cache, page_table, b, head_dim=d)
  kh = layout["kv_heads"]
  if kh == 0 or n % kh:
    raise ValueError(f"q heads ({n}) must be a multiple of the cache's KV heads ({kh})")
  if out is not None:
    inputs = [("q", q), ("k_cache codes", k_cache[0]), ("k_cache scales", k_cache[1]), ("v_cache codes", v_cache[0]),
              ("v_cache scales", v_cache[1]), ("kv_lengths", kv_lengths)]
    tt.check_output("out", out, q, inputs + ([] if page_table is None else [("page_table", page_table)]))
  if q.device.type == "cpu":  # values checked, then the XLA path
    result = _api.decode_attention(
        tt.to_jax(tt.btnh(q)), _jax_cache(k_cache), _jax_cache(v_cache), tt.to_jax(kv_lengths),
        page_table=None if page_table is None else tt.to_jax(page_table), scale=scale, is_causal=is_causal,
        num_splits=num_splits, block_n=block_n, quantize_qkv=quantize_qkv, quantize_p=quantize_p, p_scale=p_scale,
        implementation="xla")
    o = tt.from_jax(result).transpose(1, 2)
    return o.contiguous() if out is None else out.copy_(o)
  if num_splits is None:
    num_splits = default_num_splits(b, kh, layout["capacity"], check_block_n("block_n", block_n))
  opts = validate.decode_options(head_dim=d, scale=scale, is_causal=is_causal, block_n=block_n, num_splits=num_splits,
                                 quantize_qkv=quantize_qkv, quantize_p=quantize_p, p_scale=p_scale)
  if out is None:
    out = torch.empty((b, n, tq, d), dtype=q.dtype, device=q.device)
  plans, launch = _launcher()
  views = dict(q=tt.btnh(tt.readable(q)), k_codes=k_cache[0], k_scales=k_cache[1], v_codes=v_cache[0],
               v_scales=v_cache[1], kv_len=kv_lengths, o=tt.btnh(out))
  names = ("q", "k_codes", "k_scales", "v_codes", "v_scales", "kv_len")
  if page_table is not None:
    views["page_table"] = page_table.contiguous()  # the kernels index it as a dense [B, P] table
    names += ("page_table",)
  # The kernel choice is made once per plan; JQAT_DECODE_KERNEL's value is part of the plan's key.
  plan = _decode_plan(tuple(launch.describe(views[name]) for name in names), opts, launch.target(q),
                      page_table is not None, tuple(views["o"].stride()), os.environ.get(plans.DECODE_KERNEL_ENV))
  views.update(launch.allocate(plan, plan.scratch, q.device))
  launch.execute(plan, views)
  return out


@functools.cache
def _update_plan(descriptions, target, paged: bool):
  plans, _ = _launcher()
  return plans.kv_cache_update(*descriptions[:7], target, page_table=descriptions[7] if paged else None)


def kv_cache_update(k_cache, v_cache, k_new, v_new, positions, *, page_table=None):
  """Quantizes BHSD ``k_new, v_new [B, K, Tn, D]`` into the caches at ``positions int32 [B, Tn]``, in place
  (the codes and scales of ``jqat.nvfp4.quantize``, bit for bit). Returns ``(k_cache, v_cache)``, the same tensors.
  CPU tensors: out-of-range positions raise ValueError naming them; CUDA: such a write is dropped (the host reads
  no value, so the call can be captured in a CUDA graph)."""
  for name, t in (("k_new", k_new), ("v_new", v_new)):
    tt.check_tensor(name, t)
  tt.check_backend(k_new.device)
  validate.attention_inputs(k_new, k_new, v_new, layout="BHSD", names=("k_new", "k_new", "v_new"))
  b, kh, tn, d = k_new.shape
  device = k_new.device
  tt.check_device("v_new", v_new, device)
  _check_cache(k_cache, v_cache, page_table, device)
  _check("positions", positions, device)
  if positions.dtype != torch.int32:
    raise ValueError(f"positions must be int32, got {positions.dtype}")
  layout = _api.cache_layout(k_cache, v_cache, page_table, b, kh, d)
  if tuple(positions.shape) != (b, tn):
    raise ValueError(f"positions must have shape {(b, tn)} [B, Tn], got {tuple(positions.shape)}")
  for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
    if any(tt.overlap(part, new) for part in t for new in (k_new, v_new)):
      raise ValueError(f"{name} overlaps k_new or v_new")
  if device.type == "cpu":
    pos = positions.numpy()
    if pos.size and (pos.min() < 0 or pos.max() >= layout["capacity"]):
      raise ValueError(f"positions must be in [0, {layout['capacity']}), got values in [{pos.min()}, {pos.max()}]")
    new_k, new_v = _api.kv_cache_update(
        _jax_cache(k_cache), _jax_cache(v_cache), tt.to_jax(tt.btnh(k_new)), tt.to_jax(tt.btnh(v_new)),
        tt.to_jax(positions), page_table=None if page_table is None else tt.to_jax(page_table), implementation="xla")
    for dst, src in zip((*k_cache, *v_cache), (*new_k, *new_v)):
      src = tt.from_jax(jax.lax.bitcast_convert_type(src, jnp.uint8) if src.dtype == jnp.float8_e4m3fn else src)
      dst.view(torch.uint8).copy_(src.view(torch.uint8))
    return k_cache, v_cache
  _, launch = _launcher()
  views = dict(k_new=tt.btnh(tt.readable(k_new)), v_new=tt.btnh(tt.readable(v_new)), positions=positions.contiguous(),
               k_codes=k_cache[0], k_scales=k_cache[1], v_codes=v_cache[0], v_scales=v_cache[1])
  names = ("k_new", "v_new", "positions", "k_codes", "k_scales", "v_codes", "v_scales")
  if page_table is not None:
    views["page_table"] = page_table.contiguous()  # the kernels index it as a dense [B, P] table
    names += ("page_table",)
  plan = _update_plan(tuple(launch.describe(views[name]) for name in names), launch.target(k_new),
                      page_table is not None)
  views.update(k_codes_out=k_cache[0], k_scales_out=k_cache[1], v_codes_out=v_cache[0], v_scales_out=v_cache[1])
  launch.execute(plan, views)
  for cache in (k_cache, v_cache):  # written in place, as any in-place torch op
    for part in cache:
      torch.autograd.graph.increment_version(part)
  return k_cache, v_cache
