"""Shared test helpers: the GPU skip rule, NaN poisoning and the one tolerance helper."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/oracle.py


def _has_cuda_gpu() -> bool:
  try:
    import jax

    return any(d.platform == "gpu" for d in jax.devices())
  except RuntimeError:
    return False


HAS_GPU = _has_cuda_gpu()


def pytest_collection_modifyitems(config, items):
  if HAS_GPU:
    return
  skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


def kernel_device() -> str:
  """Where tests launch the framework-free kernels on torch tensors: the CPU under
  TRITON_INTERPRET=1, else CUDA (skipping when torch has no CUDA build)."""
  if os.environ.get("TRITON_INTERPRET") == "1":
    return "cpu"
  import torch

  if not torch.cuda.is_available():
    pytest.skip("compiled Triton kernels need a CUDA torch build when TRITON_INTERPRET=0")
  return "cuda"


def assert_close(actual, expected, *, rel: float, name: str = "value"):
  """Relative Frobenius error ||a - e|| / ||e|| <= rel, in float64; NaN never passes.

  The one tolerance rule of the suite: a bound is stated per check with the
  reason it has that size, and is never loosened to make a test pass.
  """
  a = np.asarray(actual, np.float64)
  e = np.asarray(expected, np.float64)
  assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
  assert not np.isnan(a).any(), f"{name}: NaN in result"
  denom = max(np.linalg.norm(e), 1e-30)
  err = np.linalg.norm(a - e) / denom
  assert err <= rel, f"{name}: relative error {err:.3e} > {rel:.1e}"
  return err
