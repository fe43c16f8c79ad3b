"""Launches the ``kernels_triton`` kernels directly on torch tensors (the ``jqat.torch`` CUDA path).

The JAX bindings (``ffi/attention.py``, ``ffi/rope_qdq.py``) launch the same
kernels through jax-triton inside XLA; here Triton's own launcher runs them on
torch tensors, on torch's *current* CUDA stream (Triton asks torch for it at
every launch), so callers pick the stream with ``torch.cuda.stream(...)``.

Every function writes into buffers the caller passes: nothing here allocates.
Attention tensors are BTNH *views* (``[B, T, heads, D]``): a BHSD tensor viewed
with ``.transpose(1, 2)`` is passed with its strides, no copy. The kernels need
the last axis contiguous (stride 1) and take the B, T and head strides; the
fake-quantization kernel walks a tensor as rows of D in storage order, so it
needs a dense tensor (see :func:`rows_dense`), and its output buffer must have
the input's strides.

Launch parameters come from the kernel modules' own helpers (``launch_config``,
``fake_quantize_launch``, ``DELTA_LAUNCH``, ``dot_flags``, ``quant_flags``), the
same ones ``ffi/attention.py`` and ``ffi/rope_qdq.py`` use, so both paths launch
identical kernels.

Under ``TRITON_INTERPRET=1`` (or for CPU tensors) the interpreter flags are used,
so the launcher itself can be tested on a CPU machine.
"""

from __future__ import annotations

import os

import triton

from kernels_triton import attention_bwd as kbwd
from kernels_triton import attention_fwd as kfwd
from kernels_triton import nvfp4 as knv
from kernels_triton import rope_qdq as krope

def interpreting(x) -> bool:
  return os.environ.get("TRITON_INTERPRET", "0") == "1" or x.device.type != "cuda"


def _cc(x):
  if interpreting(x):
    return None
  import torch  # noqa: PLC0415

  return torch.cuda.get_device_capability(x.device)


def quant_flags(x) -> dict:
  interp = interpreting(x)
  return knv.quant_flags(_cc(x), interp)


def dot_flags(x) -> dict:
  name = str(x.dtype).removeprefix("torch.")
  return kfwd.dot_flags(name, interpreting(x))


def rows_dense(x) -> bool:
  """True when ``x`` is dense (non-overlapping, no gaps, non-negative strides) with a contiguous last axis.

  Such a tensor is ``numel / D`` rows of ``D`` consecutive elements starting at ``x.data_ptr()``,
  whatever the order of its other axes.
  """
  if x.dim() == 0 or x.stride(-1) != 1:
    return False
  dims = sorted((x.stride(i), x.size(i)) for i in range(x.dim()) if x.size(i) != 1)
  expect = 1
  for stride, size in dims:
    if stride != expect:
      return False
    expect *= size
  return True


def _launch(kernel, grid, args, kwargs, warmup: bool):
  if warmup:
    if interpreting(args[0]):
      return  # nothing to compile for the interpreter
    kernel.warmup(*args, grid=grid, **kwargs)
  else:
    kernel[grid](*args, **kwargs)


def fake_quantize(x, out, *, warmup: bool = False):
  """``out = fq(x)`` along the last axis; ``x`` and ``out`` dense (:func:`rows_dense`) with equal strides."""
  assert rows_dense(x) and out.stride() == x.stride() and out.shape == x.shape, "fake_quantize: layout"
  d = x.shape[-1]
  rows = x.numel() // d
  if rows == 0:
    return out
  grid, launch = kfwd.fake_quantize_launch(rows, d)
  _launch(kfwd.fake_quantize_rows_kernel, grid, (x, rows, d, d, d, out), dict(**launch, **quant_flags(x)), warmup)
  return out


def _s3(t):
  return tuple(int(s) for s in t.stride()[:3])


def attention_forward(q, k, v, o, o_hp, lse, k_hat, v_hat, *, scale: float, is_causal: bool, block_n: int,
                      quantize_qkv: bool, quantize_p: bool, warmup: bool = False):
  """The QAT forward into ``o``, ``o_hp`` (``[B, Tq, N, D]`` views sharing strides) and ``lse`` (``[B, N, Tq]`` fp32,
  contiguous). q: ``[B, Tq, N, D]``, k, v: ``[B, Tk, K, D]`` views with a contiguous last axis; k_hat, v_hat:
  buffers with the strides of k and v for fq(K), fq(V) (unused when ``quantize_qkv`` is False).
  """
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  assert o.stride() == o_hp.stride() and lse.is_contiguous(), "attention_forward: output layout"
  if q.numel() == 0 or k.numel() == 0:  # no rows or no keys: O = O' = 0, lse = -inf (as ffi/attention.py)
    if not warmup:
      o.zero_()
      o_hp.zero_()
      lse.fill_(float("-inf"))
    return
  if quantize_qkv:
    fake_quantize(k, k_hat, warmup=warmup)
    fake_quantize(v, v_hat, warmup=warmup)
    k, v = k_hat, v_hat
  cfg = kfwd.launch_config(d)
  _launch(kfwd.attention_fwd_kernel, (triton.cdiv(tq, cfg["BLOCK_M"]), b * n),
          (q, k, v, float(scale), tq, tk, n, n // kh, *_s3(q), *_s3(k), *_s3(v), *_s3(o), o, o_hp, lse),
          dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], HEAD_DIM=d, BLOCK_M=cfg["BLOCK_M"],
               BLOCK_N=int(block_n), IS_CAUSAL=bool(is_causal), QUANTIZE_Q=bool(quantize_qkv),
               QUANTIZE_P=bool(quantize_p), **dot_flags(q), **quant_flags(q)), warmup)


def attention_backward(do, q, k, v, o_for_delta, lse, dq, dk, dv, delta, q_hat, k_hat, v_hat, *, scale: float,
                       is_causal: bool, quantize_qkv: bool, quantize_p_backward: bool, warmup: bool = False):
  """The QAT backward into ``dq``, ``dk``, ``dv`` (BTNH views) using the scratch buffers ``delta``
  (``[B, N, Tq]`` fp32 contiguous) and ``q_hat``, ``k_hat``, ``v_hat`` (fq(Q), fq(K), fq(V), with the strides of
  q, k, v; unused when ``quantize_qkv`` is False).

  The dQ kernel writes dq with the strides of the Q operand it reads, the dK/dV kernel dk, dv with those of
  K and V: so dq must have the strides of q (and q_hat), dk of k, dv of v.
  """
  b, tq, n, d = q.shape
  tk, kh = k.shape[1], k.shape[2]
  assert dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride(), \
      "attention_backward: dq/dk/dv must have the strides of q/k/v"
  assert lse.is_contiguous() and delta.is_contiguous(), "attention_backward: lse/delta layout"
  if q.numel() == 0 or k.numel() == 0:  # every gradient is an empty sum
    if not warmup:
      dq.zero_()
      dk.zero_()
      dv.zero_()
    return
  if quantize_qkv:
    fake_quantize(q, q_hat, warmup=warmup)
    fake_quantize(k, k_hat, warmup=warmup)
    fake_quantize(v, v_hat, warmup=warmup)
    q, k, v = q_hat, k_hat, v_hat
  cfg = kbwd.launch_config(d)
  _launch(kbwd.attention_bwd_delta_kernel, (triton.cdiv(tq, kbwd.DELTA_LAUNCH["BLOCK_M"]), b * n),
          (o_for_delta, do, tq, n, *_s3(o_for_delta), *_s3(do), delta), dict(HEAD_DIM=d, **kbwd.DELTA_LAUNCH), warmup)
  common = (q, k, v, do, lse, delta, float(scale), tq, tk, n, n // kh, *_s3(q), *_s3(k), *_s3(v), *_s3(do))
  flags = dict(HEAD_DIM=d, IS_CAUSAL=bool(is_causal), **dot_flags(q))
  _launch(kbwd.attention_bwd_dq_kernel, (triton.cdiv(tq, cfg["DQ_BLOCK_M"]), b * n), common + (dq,),
          dict(BLOCK_M=cfg["DQ_BLOCK_M"], BLOCK_N=cfg["DQ_BLOCK_N"], num_warps=cfg["DQ_num_warps"],
               num_stages=cfg["DQ_num_stages"], **flags), warmup)
  _launch(kbwd.attention_bwd_dkdv_kernel, (triton.cdiv(tk, cfg["KV_BLOCK_N"]), b * kh), common + (dk, dv),
          dict(BLOCK_M=cfg["KV_BLOCK_M"], BLOCK_N=cfg["KV_BLOCK_N"], QUANTIZE_P=bool(quantize_p_backward),
               num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **flags, **quant_flags(q)), warmup)


def rope_qdq_inplace(x, cache, positions, *, heads: int, width: int, group: int, fp8: bool, e4m3_scale: bool,
                     amax_floor: float, warmup: bool = False):
  """Tail RoPE + QDQ of contiguous bf16 ``x`` (rows of ``width``) written over ``x`` itself.

  cache: ``[P, 64]`` fp32 contiguous; positions: contiguous int32/int64, one per ``heads`` rows.
  """
  n_rows = x.numel() // width
  if n_rows == 0:
    return x
  hw = quant_flags(x)["HW_E4M3"]
  config = krope.launch_config(width, hw)
  _launch(krope.rope_qdq_kernel, (triton.cdiv(n_rows, config["BLOCK_R"]),),
          (x, cache, positions, n_rows, cache.shape[0], heads, x),
          dict(D=width, GROUP=group,
               FP8=bool(fp8), E4M3_SCALE=bool(e4m3_scale), AMAX_FLOOR=float(amax_floor), **config), warmup)
  return x
