"""NVFP4 QAT linear layer: ``y = fq(x) @ fq(w)``, both operands fake-quantized along the contraction axis.

Shape legend: M rows of ``x`` (all leading axes together), K the contraction
axis (a multiple of 16, the NVFP4 block), N output features.

Two implementations of one function: the pure-JAX reference (also the
``"xla"`` path) and a Pallas kernel that tiles over (M, N), walks K in tiles
of ``block_k`` and quantizes each X tile along its last axis and each W tile
along its first axis with :func:`jqat.nvfp4.fake_quantize` before a BF16
tensor-core dot with FP32 accumulation. ``fq`` values have at most 6
significant bits and lie in [2**-10, 2688], so they are exact in BF16 (and
FP16): the BF16 dot multiplies exactly, and the two implementations differ
only in FP32 summation order.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jqat import nvfp4

IMPLEMENTATIONS = (None, "pallas", "xla")
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


@dataclasses.dataclass(frozen=True)
class Config:
  """Launch configuration of the Pallas kernel (block sizes powers of two, as Triton needs;
  ``block_k`` a multiple of 16 so a K tile holds whole NVFP4 blocks)."""

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  num_warps: int = 8
  num_stages: int = 3

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_k"):
      v = getattr(self, name)
      if v < 16 or v & (v - 1):
        raise ValueError(f"Config.{name} must be a power of two >= 16, got {v}")


def _pow2_at_least(n: int, lo: int = 16) -> int:
  return max(lo, 1 << (n - 1).bit_length())


def _fit(config: Config, m: int, n: int, k: int) -> Config:
  """Shrinks the blocks to the problem (a 20-row input needs no 128-row tile)."""
  return dataclasses.replace(
      config,
      block_m=min(config.block_m, _pow2_at_least(m)),
      block_n=min(config.block_n, _pow2_at_least(n)),
      block_k=min(config.block_k, _pow2_at_least(k)),
  )


def qat_matmul_reference(x: jax.Array, w: jax.Array) -> jax.Array:
  """``fq(x) @ fq(w)`` in pure JAX: x [M, K], w [K, N] -> [M, N] in x's dtype, FP32 accumulation."""
  xq = nvfp4.fake_quantize(x, axis=-1).astype(jnp.float32)  # exact: fq values fit any of DTYPES
  wq = nvfp4.fake_quantize(w, axis=0).astype(jnp.float32)
  y = jnp.dot(xq, wq, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return y.astype(x.dtype)


def _kernel(x_ref, w_ref, o_ref, *, block_k: int, k_steps: int):
  """x_ref: [BM, K]; w_ref: [K, BN]; o_ref: [BM, BN]. Loads and quantizes one K tile per step."""

  def step(i, acc):
    ks = pl.ds(pl.multiple_of(i * block_k, block_k), block_k)
    xt = nvfp4.fake_quantize(x_ref[:, ks], axis=1).astype(jnp.bfloat16)  # exact (module docstring)
    wt = nvfp4.fake_quantize(w_ref[ks, :], axis=0).astype(jnp.bfloat16)
    return acc + jnp.dot(xt, wt, preferred_element_type=jnp.float32)

  acc = jnp.zeros(o_ref.shape, jnp.float32)
  o_ref[...] = lax.fori_loop(0, k_steps, step, acc).astype(o_ref.dtype)


def qat_matmul_pallas(x: jax.Array, w: jax.Array, config: Config | None = None, *, interpret: bool = False):
  """The Pallas kernel: x [M, K], w [K, N] -> [M, N] in x's dtype. Pads M, N and K to whole tiles
  with zeros (a zero NVFP4 block quantizes to zeros, and K % 16 == 0 keeps real blocks intact)."""
  from jax.experimental.pallas import triton as plt

  m, k = x.shape
  n = w.shape[1]
  cfg = _fit(config or Config(), m, n, k)
  mp, np_, kp = (-(-d // b) * b for d, b in ((m, cfg.block_m), (n, cfg.block_n), (k, cfg.block_k)))
  if (mp, kp) != (m, k):
    x = jnp.pad(x, ((0, mp - m), (0, kp - k)))
  if (kp, np_) != (k, n):
    w = jnp.pad(w, ((0, kp - k), (0, np_ - n)))
  params = {} if interpret else {"compiler_params": plt.CompilerParams(num_warps=cfg.num_warps,
                                                                       num_stages=cfg.num_stages)}
  y = pl.pallas_call(
      functools.partial(_kernel, block_k=cfg.block_k, k_steps=kp // cfg.block_k),
      grid=(mp // cfg.block_m, np_ // cfg.block_n),
      in_specs=[pl.BlockSpec((cfg.block_m, kp), lambda i, j: (i, 0)),
                pl.BlockSpec((kp, cfg.block_n), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((cfg.block_m, cfg.block_n), lambda i, j: (i, j)),
      out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
      interpret=interpret,
      name="jqat_qat_matmul",
      **params,
  )(x, w)
  return y[:m, :n]


def _on_nvidia_gpu() -> bool:
  dev = jax.devices()[0]
  return dev.platform == "gpu" and "rocm" not in dev.client.platform_version.lower()


def _forward(x, w, implementation, config):
  if implementation == "xla" or 0 in (x.shape[0], w.shape[1], x.shape[1]):
    return qat_matmul_reference(x, w)
  return qat_matmul_pallas(x, w, config, interpret=not _on_nvidia_gpu())


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _qat_matmul(x, w, implementation, config):
  return _forward(x, w, implementation, config)


def _qat_matmul_fwd(x, w, implementation, config):
  return _forward(x, w, implementation, config), (x, w)


def _qat_matmul_bwd(implementation, config, res, dy):
  del implementation, config
  x, w = res
  # The straight-through estimator through both quantizers, in XLA with FP32 accumulation;
  # fq values are exact in dy's dtype (f32, bf16 or f16).
  xq = nvfp4.fake_quantize(x, axis=-1).astype(dy.dtype)
  wq = nvfp4.fake_quantize(w, axis=0).astype(dy.dtype)
  dot = functools.partial(jnp.dot, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return dot(dy, wq.T).astype(x.dtype), dot(xq.T, dy).astype(w.dtype)


_qat_matmul.defvjp(_qat_matmul_fwd, _qat_matmul_bwd)


def qat_matmul(x: jax.Array, w: jax.Array, *, implementation: str | None = None, config: Config | None = None):
  """NVFP4 QAT linear layer: ``fq(x) @ fq(w)`` with both operands quantized along the contraction axis.

  x: [..., K] f32, bf16 or f16; quantized in blocks of 16 along its last axis.
  w: [K, N] f32, bf16 or f16; quantized in blocks of 16 along its first axis.
  K must be a multiple of 16. Returns [..., N] in x's dtype, accumulated in FP32
  (docs/NUMERICS.md, section 2, for ``fq``: the same quantizer as the attention).

  implementation: None (the Pallas kernel, Triton backend, on an NVIDIA GPU; else
    the XLA reference), ``"pallas"`` (the kernel; interpret mode where there is no
    NVIDIA GPU) or ``"xla"`` (the pure-JAX reference).
  config: the kernel's :class:`Config` (block sizes are shrunk to small problems).

  Gradient (a ``jax.custom_vjp``): the straight-through estimator applied to both
  quantizers, ``dX = dY @ fq(W)^T`` and ``dW = fq(X)^T @ dY``, computed in XLA with
  FP32 accumulation and returned in x's and w's dtypes.
  """
  x = jnp.asarray(x)
  w = jnp.asarray(w)
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"qat_matmul: implementation must be one of None, 'pallas', 'xla', got {implementation!r}")
  if config is not None and not isinstance(config, Config):
    raise TypeError(f"qat_matmul: config must be a qat_matmul Config, got {type(config).__name__}")
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
  if implementation is None:
    implementation = "pallas" if _on_nvidia_gpu() else "xla"
  y = _qat_matmul(x.reshape(-1, k), w, implementation, config)
  return y.reshape(x.shape[:-1] + (w.shape[1],))
