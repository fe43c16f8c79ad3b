"""XLA binding of ``kernels_triton.rope_qdq``: one in-place custom call per op."""

from __future__ import annotations

import jax

from ffi.triton_call import triton_call
from kernels_triton.rope_qdq import rope_qdq_kernel

# Rows per program: 4096 channels (8 KiB of bf16) each, enough bytes in flight per
# program for a streaming kernel while the whole row block stays in registers.
_TILE = 4096
_NUM_WARPS = 4


def rope_qdq(x, cache, positions, *, heads, width, group, fp8, e4m3_scale, amax_floor):
  """x: [..., width] bf16 (rows flattened); cache: [P, 64] fp32; positions: [rows // heads] int32/int64.

  Returns the QDQ result in x's buffer: output 0 aliases input 0, so under
  ``jax.jit(..., donate_argnums=...)`` no new buffer is allocated.
  """
  n_rows = x.size // width
  block_r = _TILE // width
  return triton_call(
      x, cache, positions, n_rows, cache.shape[0], heads,
      kernel=rope_qdq_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(-(-n_rows // block_r),),
      num_warps=_NUM_WARPS,
      input_output_aliases={0: 0},
      name="jqat_rope_qdq",
      D=width, GROUP=group, FP8=bool(fp8), E4M3_SCALE=bool(e4m3_scale), AMAX_FLOOR=float(amax_floor),
      BLOCK_R=block_r,
  )
