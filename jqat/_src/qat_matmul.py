"""NVFP4 QAT linear layer: ``y = fq(x) @ fq(w)``, both operands fake-quantized along the contraction axis.

Shape legend: x ``[..., K]`` (M rows: all leading axes together), K the contraction axis (a multiple of 16, the
NVFP4 block), N output features, w ``[K, N]``.

Each operand is quantized once per call, then multiplied by one BF16 tensor-core dot with FP32 accumulation
(``lax.dot_general``: cuBLAS or XLA's own GEMM on the GPU). ``fq`` values have at most 6 significant bits and lie
in [2**-10, 2688] (or are 0 or NaN), so they are exact in BF16 (and FP16): the dot multiplies exactly, whatever
x's and w's dtypes, and the implementations differ only in FP32 summation order.
The quantizer (docs/NUMERICS.md, section 2):

- ``"triton"``: two Triton passes through the launch plans (``jqat.ffi.plan.fake_quantize_rows``, the attention
  plans' fake-quantize pass, over x's rows of K; ``fake_quantize_columns`` over w's columns, blocks along axis
  0 read in w's own layout), each reading its operand once and writing fq as BF16;
- ``"xla"``: :func:`jqat.nvfp4.fake_quantize` in XLA (bit for bit the same values).

The quantizer is :mod:`jqat._src.nvfp4`; :mod:`jqat.nvfp4` names both (no module here imports it back).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jqat._src import dispatch, nvfp4

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
OPERAND_DTYPE = jnp.bfloat16  # of the forward's dot: exact for every fq value


def _quantized(x, w, impl: str):
  """``(fq(x) along its last axis, fq(w) along axis 0)`` as BF16 (exact)."""
  if impl == "triton":
    from jqat.ffi import jax_launch  # noqa: PLC0415  (the GPU binding; imported when used)

    return jax_launch.fake_quantize(x, -1, OPERAND_DTYPE), jax_launch.fake_quantize(w, 0, OPERAND_DTYPE)
  return (nvfp4.fake_quantize(x, axis=-1).astype(OPERAND_DTYPE),
          nvfp4.fake_quantize(w, axis=0).astype(OPERAND_DTYPE))


def _dot(a, b, contracting, out_dtype):
  """``dot_general`` of ``a`` and ``b`` over ``contracting`` with FP32 accumulation, rounded once to ``out_dtype``.
  Operands in one dtype; FP32 ones at full precision (on the GPU the default would be TF32)."""
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  y = lax.dot_general(a, b, (contracting, ((), ())), precision=precision, preferred_element_type=jnp.float32)
  return y.astype(out_dtype)


def _forward_dot(xq, wq, out_dtype):
  return _dot(xq, wq, ((xq.ndim - 1,), (0,)), out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _qat_matmul(x, w, impl):
  return _forward_dot(*_quantized(x, w, impl), x.dtype)


def _qat_matmul_fwd(x, w, impl):
  xq, wq = _quantized(x, w, impl)
  # The residuals are the quantized operands (BF16, the size of bf16 x and w): the backward quantizes nothing.
  # w's dtype rides along as an empty array (custom_vjp residuals are arrays).
  return _forward_dot(xq, wq, x.dtype), (xq, wq, jnp.zeros((0,), w.dtype))


def _qat_matmul_bwd(impl, res, dy):
  del impl
  xq, wq, w_like = res
  # The straight-through estimator through both quantizers: dX = dY @ fq(W)^T, dW = fq(X)^T @ dY, with FP32
  # accumulation, as dots in dY's dtype (x's): fq values are exact in f32, bf16 and f16.
  xq, wq = xq.astype(dy.dtype), wq.astype(dy.dtype)
  lead = tuple(range(dy.ndim - 1))
  dx = _dot(dy, wq, ((dy.ndim - 1,), (1,)), dy.dtype)
  dw = _dot(xq, dy, (lead, lead), w_like.dtype)
  return dx, dw


_qat_matmul.defvjp(_qat_matmul_fwd, _qat_matmul_bwd)


def qat_matmul(x: jax.Array, w: jax.Array, *, implementation: str | None = None, config=None) -> jax.Array:
  """NVFP4 QAT linear layer: ``fq(x) @ fq(w)`` with both operands quantized along the contraction axis.

  x: [..., K] f32, bf16 or f16; quantized in blocks of 16 along its last axis.
  w: [K, N] f32, bf16 or f16; quantized in blocks of 16 along its first axis.
  K must be a multiple of 16. Returns [..., N] in x's dtype: the product of the quantized operands (exact in BF16)
  by a BF16 tensor-core dot accumulated in FP32, rounded once (``fq``: docs/NUMERICS.md, section 2, the same
  quantizer as the attention's). A NaN in a block of x (of w) makes its output row (column) NaN.

  implementation: None (the Triton quantize passes on a supported NVIDIA GPU, else XLA's), ``"triton"`` (raises
    where it cannot run) or ``"xla"`` (:func:`jqat.nvfp4.fake_quantize`); both then call the same XLA dot and
    give the same fq bits. ``"pallas"``, the former Pallas kernel, is gone: it raises, naming the replacement.
  config: must be None (it configured that Pallas kernel; the passes take their launch parameters from the plans).

  Gradient (a ``jax.custom_vjp``): the straight-through estimator applied to both quantizers,
  ``dX = dY @ fq(W)^T`` and ``dW = fq(X)^T @ dY``, from the forward's fq(x), fq(w) (the residuals: nothing is
  quantized again), as two dots in dY's dtype with FP32 accumulation, returned in x's and w's dtypes.
  Works under jit, vmap and grad; sharded operands keep their shardings through the quantize passes (each pass
  has a partitioning rule, ``jqat.ffi.partitioning.fake_quantize_spec``), and XLA partitions the dots.
  """
  x = jnp.asarray(x)
  w = jnp.asarray(w)
  if implementation == "pallas":
    raise ValueError("qat_matmul: implementation='pallas' was removed (that kernel quantized every tile again "
                     "inside its matmul loop); use None or 'triton' (Triton quantize passes + a BF16 dot) or 'xla'")
  if not (implementation is None or isinstance(implementation, str)) or implementation not in dispatch.IMPLEMENTATIONS:
    raise ValueError(f"qat_matmul: implementation must be one of None, 'triton', 'xla', got {implementation!r}")
  if config is not None:
    raise TypeError(f"qat_matmul: config must be None (it configured the removed Pallas kernel), got "
                    f"{type(config).__name__}")
  for name, a in (("x", x), ("w", w)):
    if a.dtype not in DTYPES:
      raise TypeError(f"qat_matmul: {name} must be float32, bfloat16 or float16, got {a.dtype}")
  if x.ndim < 1:
    raise ValueError(f"qat_matmul: x must have rank >= 1 ([..., K]), got shape {x.shape}")
  if w.ndim != 2:
    raise ValueError(f"qat_matmul: w must have rank 2 ([K, N]), got shape {w.shape}")
  k = x.shape[-1]
  if w.shape[0] != k:
    raise ValueError(f"qat_matmul: w.shape[0] must equal x.shape[-1] = {k} (K), got w.shape {w.shape}")
  if k % nvfp4.BLOCK:
    raise ValueError(f"qat_matmul: K = x.shape[-1] must be a multiple of {nvfp4.BLOCK}, got {k}")
  impl = dispatch.resolve(implementation)
  if x.size == 0 or w.size == 0:  # no rows, no columns, or an empty sum (K = 0): zeros, and zero gradients
    return jnp.zeros(x.shape[:-1] + (w.shape[1],), x.dtype)
  return _qat_matmul(x, w, impl)
