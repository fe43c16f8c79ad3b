"""Runs Python code on N virtual CPU devices, in a fresh interpreter.

XLA reads ``--xla_force_host_platform_device_count`` once, when jax initializes its
CPU backend; the test process has initialized jax long before a test runs (conftest
imports it), so multi-device code needs its own process. Independent of conftest so
sharding tests and scripts can share it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_on_cpu_devices(code: str, n_devices: int = 8, timeout: float = 600.0) -> str:
  """Executes ``code`` with ``n_devices`` CPU devices as ``jax.devices()``; returns its stdout.

  The repository root and tests/ are on ``sys.path`` (``import jqat``, ``import oracle``).
  Raises AssertionError with the child's stderr when it exits nonzero.
  """
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={n_devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, os.path.join(_REPO, "tests"), env.get("PYTHONPATH")) if p)
  result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
  assert result.returncode == 0, f"code on {n_devices} CPU devices failed:\n{result.stderr[-4000:]}"
  return result.stdout
