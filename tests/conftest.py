"""Shared test helpers: the GPU skip rule, NaN poisoning, the one tolerance helper and the benchmark-script loader."""

import os
import subprocess
import sys

import numpy as np
import pytest


def _has_cuda_gpu() -> bool:
  try:
    import jax

    return any(d.platform == "gpu" for d in jax.devices())
  except RuntimeError:
    return False


HAS_GPU = _has_cuda_gpu()
# Once, before any test module imports triton (which reads it when a kernel is defined): the
# interpreter on CPU machines, compiled kernels on a GPU. Test order must not decide it.
os.environ.setdefault("TRITON_INTERPRET", "0" if HAS_GPU else "1")
if os.environ["TRITON_INTERPRET"] == "1":  # kernels launched straight from tests run in the interpreter too
  from jqat.ffi import interpreter

  interpreter.install()


BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def load_bench(name: str):
  """benchmarks/<name>.py as a module (``bench_<name>``), without putting benchmarks/ on sys.path for the rest of the
  suite."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


_CHILD = "JQAT_TEST_CHILD"


def pytest_pyfunc_call(pyfuncitem):
  """Tests marked ``fresh_process`` run in a new interpreter with compiled (not interpreted) Triton.

  Once Triton's interpreter has run a kernel in a process (the interpreted kernel tests do), a
  real compile in that process fails inside Triton (seen: ``AttributeError`` on ``ir.value.dtype``);
  the tests that compile kernels for sm_90 on the CPU therefore get a process of their own.
  """
  if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(_CHILD) == pyfuncitem.nodeid:
    return None
  env = {**os.environ, _CHILD: pyfuncitem.nodeid, "TRITON_INTERPRET": "0"}
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", pyfuncitem.nodeid],
                        cwd=str(pyfuncitem.config.rootpath), env=env, capture_output=True, text=True, timeout=900,
                        check=False)
  if proc.returncode != 0:
    raise AssertionError(f"{pyfuncitem.nodeid} failed in its own process:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
  if " passed" not in proc.stdout:
    pytest.skip(f"skipped in its own process: {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ''}")
  return True


def pytest_collection_finish(session):
  """The 8-device children (``run_cases`` of each module whose tests take the ``child_results`` fixture:
  tests/test_parallel.py ~80 s on 2 cores, tests/test_shard_map_xla.py) start as soon as the selection
  needs them and run beside the other tests, which mostly compile on one core; each module's fixture then
  collects its child (tests/multidevice.py)."""
  if session.config.option.collectonly:
    return
  modules = {item.module.__name__ for item in session.items if "child_results" in getattr(item, "fixturenames", ())}
  if modules:
    import multidevice

    for module in sorted(modules):
      multidevice.start_json(module, "run_cases")


def pytest_sessionfinish(session):
  if "multidevice" in sys.modules:
    sys.modules["multidevice"].stop_started()


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


def assert_reordered_equal(actual, expected, *, name: str = "value", dtype=None):
  """Two computations of the same function that differ only in FP32 summation order.

  For two differently compiled XLA programs (jit vs eager, vmap vs a loop, remat
  or not), which XLA does not promise to make bitwise equal: the FP32 values
  before the final rounding differ by reduction-order noise, so each stored
  element is either equal or one rounding step apart (where the noise straddles
  a rounding boundary), plus absolute noise ~2**-20 of the tensor's scale where
  terms cancel (an exact 0 against 1e-7). A skipped spec rounding moves most
  elements instead, so at most 1% of the elements (and one) may differ at all.
  NaN must sit at the same positions.
  """
  a = np.asarray(actual, np.float64)
  e = np.asarray(expected, np.float64)
  assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
  nan_a, nan_e = np.isnan(a), np.isnan(e)
  assert (nan_a == nan_e).all(), f"{name}: NaN at different positions"
  a, e = np.where(nan_a, 0.0, a), np.where(nan_e, 0.0, e)
  assert (np.isinf(a) == np.isinf(e)).all() and (a[np.isinf(a)] == e[np.isinf(e)]).all(), f"{name}: Inf differs"
  a, e = np.where(np.isinf(a), 0.0, a), np.where(np.isinf(e), 0.0, e)
  mant = {np.dtype("float32"): 23, np.dtype("float16"): 10}.get(np.dtype(dtype or np.asarray(actual).dtype), 7)
  big = np.maximum(np.abs(a), np.abs(e))
  ulp = np.exp2(np.floor(np.log2(np.where(big > 0, big, 1.0))) - mant)
  noise = 2.0**-20 * max(np.abs(e).max(initial=0.0), 1e-30)
  diff = np.abs(a - e)
  far = diff > ulp + noise
  assert not far.any(), f"{name}: {far.sum()} elements differ by more than one rounding step (max {diff.max():.3e})"
  differ = int((diff > noise).sum())
  assert differ <= max(1, a.size // 100), f"{name}: {differ} of {a.size} elements differ (a skipped rounding?)"
