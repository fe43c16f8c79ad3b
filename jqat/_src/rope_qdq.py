"""Public tail RoPE + microscaled QDQ (docs/NUMERICS.md, section 9): validation and implementation dispatch.

Numerics, non-finite inputs included, are in docs/NUMERICS.md ("Tail RoPE + QDQ:
non-finite inputs"); the reference and the kernel follow them bit for bit.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jqat._src import dispatch
from jqat._src import rope_qdq_reference as reference

_CHOICES = ", ".join(f"(quantization={q!r}, group_size={g}, scale_format={s!r})" for q, g, s in reference.MODES)


def _mode(quantization, group_size, scale_format) -> reference.Mode:
  """The mode of the keywords (docs/NUMERICS.md, 9.2); a wrong type is a TypeError, a wrong value a ValueError."""
  for name, value, choices in (("quantization", quantization, "'fp4' or 'fp8'"),
                               ("scale_format", scale_format, "'ue8m0' or 'e4m3'")):
    if not isinstance(value, str):
      raise TypeError(f"{name} must be a str ({choices}), got {type(value).__name__} {value!r}")
  # bool is an int subclass and 32.0 == 32: both are refused rather than read as a size.
  if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
    raise TypeError(f"group_size must be an int (16 or 32), got {type(group_size).__name__} {group_size!r}")
  if quantization not in ("fp4", "fp8"):
    raise ValueError(f"quantization must be 'fp4' or 'fp8', got {quantization!r}")
  if scale_format not in ("ue8m0", "e4m3"):
    raise ValueError(f"scale_format must be 'ue8m0' or 'e4m3', got {scale_format!r}")
  if group_size not in (16, 32):
    raise ValueError(f"group_size must be 16 or 32, got {group_size!r}")
  key = (quantization, int(group_size), scale_format)
  if key not in reference.MODES:
    raise ValueError(f"quantization, group_size and scale_format must be one of {_CHOICES}; "
                     f"got (quantization={quantization!r}, group_size={group_size}, scale_format={scale_format!r})")
  return reference.MODES[key]


def check_arrays(x, cache, positions, mode: reference.Mode):
  """Shape and dtype rules of docs/NUMERICS.md, section 9.2, shared by the JAX op and the torch shim.

  Works on anything with ``shape`` and ``dtype`` (JAX arrays, torch tensors);
  raises naming the argument, what was expected and what was given.
  """
  for name, a in (("x", x), ("cache", cache), ("positions", positions)):
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
      raise TypeError(f"{name} must be an array, got {type(a).__name__}")
  dtype = lambda a: str(a.dtype).removeprefix("torch.")
  if dtype(x) != "bfloat16":
    raise TypeError(f"x must be bfloat16, got {dtype(x)}")
  if mode.per_token:
    if len(x.shape) != 3 or x.shape[-1] != mode.width:
      raise ValueError(f"x must have shape [N, H, {mode.width}] for quantization='fp4', group_size=32, "
                       f"scale_format='ue8m0', got {tuple(x.shape)}")
    pos_shapes = [(x.shape[0],)]
  else:
    if len(x.shape) < 2 or x.shape[-1] != mode.width:
      raise ValueError(f"x must have shape [..., {mode.width}] with rank >= 2 for this mode, got {tuple(x.shape)}")
    pos_shapes = [tuple(x.shape[:-1]), (math.prod(x.shape[:-1]),)]
  if dtype(cache) != "float32":
    raise TypeError(f"cache must be float32, got {dtype(cache)}")
  if len(cache.shape) != 2 or cache.shape[1] != reference.ROPE_CHANNELS or cache.shape[0] < 1:
    raise ValueError(f"cache must have shape [P, 64] with P >= 1 (32 cosines then 32 sines), got {tuple(cache.shape)}")
  if dtype(positions) not in ("int32", "int64"):
    raise TypeError(f"positions must be int32 or int64, got {dtype(positions)}")
  if tuple(positions.shape) not in pos_shapes:
    per = "token (x.shape[0])" if mode.per_token else "row (prod(x.shape[:-1]))"
    raise ValueError(f"positions must hold one id per {per}: shape "
                     f"{' or '.join(str(s) for s in dict.fromkeys(pos_shapes))}, got {tuple(positions.shape)}")


def rope_qdq(x, cache, positions, *, quantization="fp4", group_size=32, scale_format="ue8m0", implementation=None):
  """Tail RoPE on the last 64 channels, then microscaled quantize/dequantize of every channel.

  x: [N, H, 128] bf16 for (fp4, 32, ue8m0); [..., 512] bf16 (rank >= 2) for
    (fp8, 32, ue8m0) and (fp4, 16, e4m3).
  cache: [P, 64] float32, 32 cosines then 32 sines per position.
  positions: int32/int64; [N] (one per token, shared by its H heads) for the
    [N, H, 128] mode, else x.shape[:-1] or flat [prod(x.shape[:-1])] (one per row).
    Ids should lie in [0, P); others read the nearest row (negative ids row 0, ids >= P
    row P - 1, int64 ids of 2**31 and more included: clamped, never wrapped).
  quantization, group_size, scale_format: one of the modes of docs/NUMERICS.md, section 9 ("fp4"/"fp8" str,
    16/32 int, "ue8m0"/"e4m3" str); a wrong type raises TypeError, a wrong value ValueError.
  implementation: None (Triton on a supported GPU, else XLA), "triton" or "xla".

  Returns a new bf16 array shaped like x. Functional; under
  ``jax.jit(..., donate_argnums=0)`` the Triton path writes into x's buffer.

  Non-finite inputs (docs/NUMERICS.md), the same bits on every path: the rotation
  follows IEEE (``Inf * 0`` and ``Inf - Inf`` give NaN, overflow gives +-Inf). A group
  holding a NaN (from x, the cache row or the rotation) is NaN throughout, written as
  the canonical BF16 NaN 0x7FC0; no NaN reaches another group. +-Inf counts as the
  largest finite FP32 value for the group amax (scale 2**126 for fp4/UE8M0, 2**120 for
  fp8/UE8M0, 448 for E4M3) and quantizes to +-limit * scale: +-Inf in the UE8M0 modes
  (the product overflows), +-2688 in the E4M3 mode.
  """
  mode = _mode(quantization, group_size, scale_format)
  check_arrays(x, cache, positions, mode)
  if implementation is not None and not isinstance(implementation, str):
    raise TypeError(f"implementation must be None, 'triton' or 'xla', got {type(implementation).__name__} "
                    f"{implementation!r}")
  dispatch.check_implementation(implementation)
  if isinstance(positions, np.ndarray) and positions.dtype == np.int64:
    # Without jax_enable_x64, jnp.asarray narrows int64 to int32 by wrapping (2**32 + 3 -> 3):
    # host ids are clamped into [0, P) first, as the device paths clamp theirs.
    positions = np.clip(positions, 0, cache.shape[0] - 1).astype(np.int32)
  x, cache, positions = jnp.asarray(x), jnp.asarray(cache), jnp.asarray(positions)
  impl = dispatch.resolve(implementation)
  if x.size == 0:
    return x
  heads = x.shape[1] if mode.per_token else 1
  if impl == "triton":
    from jqat.ffi import jax_launch  # noqa: PLC0415  (GPU only: jax-triton needs CUDA to import)
    return jax_launch.rope_qdq(x, cache, positions.reshape(-1), heads=heads, group=mode.group, fp8=mode.fp8,
                               e4m3_scale=mode.e4m3_scale, amax_floor=mode.floor)
  row_positions = jnp.repeat(positions.reshape(-1), heads)
  out = reference.rope_qdq(x.reshape(-1, mode.width), cache, row_positions, mode)
  return out.reshape(x.shape)
