"""XLA binding of ``kernels_triton.rope_qdq``: one in-place custom call per op."""

from __future__ import annotations

import functools

import jax

from ffi.triton_call import triton_call
from kernels_triton import nvfp4 as knv
from kernels_triton.rope_qdq import launch_config, rope_qdq_kernel


@functools.lru_cache(maxsize=None)
def _hw() -> bool:
  """Hardware BF16/E4M3 conversions (cvt.rn.satfinite.e4m3x2.f32 needs sm_89+)."""
  dev = jax.devices()[0]
  return knv.quant_flags(getattr(dev, "compute_capability", None))["HW_E4M3"]


def rope_qdq(x, cache, positions, *, heads, width, group, fp8, e4m3_scale, amax_floor):
  """x: [..., width] bf16 (rows flattened); cache: [P, 64] fp32; positions: [rows // heads] int32/int64.

  Returns the QDQ result in x's buffer: output 0 aliases input 0, so under
  ``jax.jit(..., donate_argnums=...)`` no new buffer is allocated.
  """
  n_rows = x.size // width
  config = launch_config(width, _hw())
  num_warps, num_stages = config.pop("num_warps"), config.pop("num_stages")
  return triton_call(
      x, cache, positions, n_rows, cache.shape[0], heads,
      kernel=rope_qdq_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(-(-n_rows // config["BLOCK_R"]),),
      num_warps=num_warps,
      num_stages=num_stages,
      input_output_aliases={0: 0},
      name="jqat_rope_qdq",
      D=width, GROUP=group, FP8=bool(fp8), E4M3_SCALE=bool(e4m3_scale), AMAX_FLOOR=float(amax_floor),
      **config,
  )
