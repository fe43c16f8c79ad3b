"""The one place that decides between the Triton kernels and the XLA reference."""

from __future__ import annotations

import functools

import jax

IMPLEMENTATIONS = (None, "triton", "xla")


def check_implementation(implementation):
  if not (implementation is None or isinstance(implementation, str)) or implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of None, 'triton', 'xla', got {implementation!r}")


@functools.cache
def triton_unavailable_reason() -> str | None:
  """None when the Triton path can run on the default device, else why not."""
  try:
    dev = jax.devices()[0]
  except RuntimeError as e:  # pragma: no cover
    return f"no JAX device ({e})"
  if dev.platform != "gpu" or "rocm" in dev.client.platform_version.lower():
    return f"the default JAX device is {dev.platform} ({getattr(dev, 'device_kind', '?')}), not an NVIDIA GPU"
  cc = getattr(dev, "compute_capability", None)
  if cc is not None and float(cc) < 8.0:
    return f"compute capability {cc} is below 8.0 (Ampere)"
  try:
    import jax_triton  # noqa: F401
    import triton  # noqa: F401
  except ImportError as e:
    return f"triton and jax-triton are needed for the GPU kernels ({e}); install jqat[gpu]"
  return None


def resolve(implementation, unsupported: str | None = None) -> str:
  """Returns "triton" or "xla"; raises when "triton" was asked for and cannot run.

  unsupported: why the kernels cannot take this call (its shapes or options), or None. With
  ``implementation=None`` such a call falls through to the XLA reference.
  """
  check_implementation(implementation)
  if implementation == "xla":
    return "xla"
  reason = triton_unavailable_reason() or unsupported
  if implementation == "triton" and reason is not None:
    raise RuntimeError(f"implementation='triton' cannot run here: {reason}. Use implementation='xla' or None.")
  return "xla" if reason is not None else "triton"
