"""NVFP4 quantization inside your own Pallas kernels, and a QAT linear layer built on it.

  python examples/pallas_qat_linear.py   # on a GPU: compiled Pallas (Triton); else interpret mode / XLA

1. A user kernel: quantize-on-write of a [T, D] KV block into packed NVFP4 (codes + E4M3 scales)
   with ``jqat.nvfp4.quantize`` called inside the ``pl.pallas_call`` body, checked against the
   same function outside Pallas.
2. ``jqat.nvfp4.qat_matmul``: a two-layer MLP whose linears see NVFP4 weights and activations in
   the forward (straight-through gradients), trained for a few steps on a toy regression (the
   Triton quantize passes and a BF16 dot on an NVIDIA GPU, the XLA quantizer elsewhere).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from jqat import nvfp4

ON_GPU = jax.devices()[0].platform == "gpu"
PALLAS_KW = {"compiler_params": plt.CompilerParams()} if ON_GPU else {"interpret": True}


def quantize_kv_block(kv: jax.Array) -> tuple[jax.Array, jax.Array]:
  """kv: [T, D] bf16 (T, D powers of two, D % 16 == 0) -> codes [T, D // 2] uint8, scales [T, D // 16] e4m3."""
  t, d = kv.shape

  def kernel(kv_ref, codes_ref, scales_ref):
    codes_ref[...], scales_ref[...] = nvfp4.quantize(kv_ref[...], axis=-1)

  out_shape = (jax.ShapeDtypeStruct((t, d // 2), jnp.uint8), jax.ShapeDtypeStruct((t, d // 16), jnp.float8_e4m3fn))
  return pl.pallas_call(kernel, out_shape=out_shape, **PALLAS_KW)(kv)


def mlp(params, x):
  """x: [B, 64] -> [B, 1]; both linears are NVFP4 QAT matmuls (K = 64 and 128, multiples of 16)."""
  h = jax.nn.gelu(nvfp4.qat_matmul(x, params["w1"]))
  return nvfp4.qat_matmul(h, params["w2"])


def main():
  print(f"device: {jax.devices()[0].device_kind} ({'compiled Pallas Triton' if ON_GPU else 'Pallas interpret mode'})")

  kv = jax.random.normal(jax.random.key(0), (64, 128), jnp.float32).astype(jnp.bfloat16)
  codes, scales = jax.jit(quantize_kv_block)(kv)
  want_codes, want_scales = jax.jit(nvfp4.quantize)(kv)  # jitted: eager, each op of it would compile alone
  same = bool((codes == want_codes).all()) and bool((scales.view(jnp.uint8) == want_scales.view(jnp.uint8)).all())
  kv32 = kv.astype(jnp.float32)
  err = jnp.linalg.norm(jax.jit(nvfp4.dequantize, static_argnames="dtype")(codes, scales, dtype=jnp.float32) - kv32)
  err = err / jnp.linalg.norm(kv32)
  print(f"kernel quantize == nvfp4.quantize: {same}; NVFP4 relative error of the KV block: {float(err):.3f}")

  kx, k1, k2 = jax.random.split(jax.random.key(1), 3)
  x = jax.random.normal(kx, (256, 64), jnp.float32)
  y = jnp.sin(x[:, :1] * 2) + 0.5 * x[:, 1:2]
  params = {"w1": jax.random.normal(k1, (64, 128)) / 8, "w2": jax.random.normal(k2, (128, 1)) / 11}
  loss = jax.jit(lambda p: jnp.mean((mlp(p, x) - y) ** 2))
  step = jax.jit(lambda p: jax.tree.map(lambda w, g: w - 0.1 * g, p, jax.grad(loss)(p)))
  first = float(loss(params))
  for _ in range(30):
    params = step(params)
  print(f"QAT MLP loss: {first:.4f} -> {float(loss(params)):.4f} after 30 SGD steps")


if __name__ == "__main__":
  main()
