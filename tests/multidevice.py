"""Runs test code on N virtual CPU devices, in a fresh interpreter.

XLA reads ``--xla_force_host_platform_device_count`` once, when jax initializes its CPU
backend; the test process has initialized jax long before a test runs (conftest imports
it), so multi-device code needs its own process. Independent of conftest so sharding
tests and scripts can share it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, devices: int, timeout: float) -> subprocess.CompletedProcess:
  """``code`` in a child with ``devices`` CPU devices; the repository root, tests/ and examples/ on ``sys.path``."""
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  paths = (ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "examples"), env.get("PYTHONPATH"))
  env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
  return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, check=False)


def run_on_cpu_devices(code: str, n_devices: int = 8, timeout: float = 600.0) -> str:
  """Executes ``code`` with ``n_devices`` CPU devices as ``jax.devices()``; returns its stdout.

  Raises AssertionError with the child's stderr when it exits nonzero.
  """
  result = _run(textwrap.dedent(code), n_devices, timeout)
  assert result.returncode == 0, f"code on {n_devices} CPU devices failed:\n{result.stderr[-4000:]}"
  return result.stdout


def run_json(module: str, function: str, *, devices: int = 8, timeout: float = 600) -> object:
  """``tests/<module>.py``'s ``function()`` in a child with ``devices`` CPU devices; returns its JSON result.

  The function returns something JSON-serializable; a failure of the child raises with its stderr.
  """
  code = (f"import json, sys, {module}\n"
          f"result = {module}.{function}()\n"
          f"sys.stdout.write('\\n@@RESULT@@' + json.dumps(result))\n")
  proc = _run(code, devices, timeout)
  if proc.returncode != 0 or "@@RESULT@@" not in proc.stdout:
    raise RuntimeError(f"{module}.{function} on {devices} CPU devices failed (rc {proc.returncode}):\n"
                       f"{proc.stderr[-6000:]}")
  return json.loads(proc.stdout.rsplit("@@RESULT@@", 1)[1])
