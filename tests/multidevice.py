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
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Child:
  """``code`` in a child with ``devices`` CPU devices, started now; ``wait`` collects it.

  The repository root, tests/ and examples/ are on the child's ``sys.path``. Its output goes to
  temporary files, not pipes, so a child started early never blocks on a full pipe while nobody reads.
  """

  def __init__(self, code: str, devices: int):
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    paths = (ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "examples"), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    self._proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=self._out,
                                  stderr=self._err, text=True)

  def wait(self, timeout: float) -> subprocess.CompletedProcess:
    try:
      self._proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      raise
    self._out.seek(0)
    self._err.seek(0)
    return subprocess.CompletedProcess(self._proc.args, self._proc.returncode, self._out.read(), self._err.read())

  def kill(self) -> None:
    self._proc.kill()
    self._proc.wait()


def _run(code: str, devices: int, timeout: float) -> subprocess.CompletedProcess:
  return _Child(code, devices).wait(timeout)


def run_on_cpu_devices(code: str, n_devices: int = 8, timeout: float = 600.0) -> str:
  """Executes ``code`` with ``n_devices`` CPU devices as ``jax.devices()``; returns its stdout.

  Raises AssertionError with the child's stderr when it exits nonzero.
  """
  result = _run(textwrap.dedent(code), n_devices, timeout)
  assert result.returncode == 0, f"code on {n_devices} CPU devices failed:\n{result.stderr[-4000:]}"
  return result.stdout


def _json_code(module: str, function: str) -> str:
  return (f"import json, sys, {module}\n"
          f"result = {module}.{function}()\n"
          f"sys.stdout.write('\\n@@RESULT@@' + json.dumps(result))\n")


_STARTED: dict[tuple[str, str, int], _Child] = {}


def start_json(module: str, function: str, *, devices: int = 8) -> None:
  """Starts ``run_json(module, function, devices=devices)``'s child now, to run beside other tests.

  A later ``run_json`` with the same arguments collects this child instead of starting one
  (tests/conftest.py starts the long 8-device child when the session's selection needs it).
  """
  key = (module, function, devices)
  if key not in _STARTED:
    _STARTED[key] = _Child(_json_code(module, function), devices)


def stop_started() -> None:
  """Kills children that ``start_json`` started and no test collected (a session stopped early, ``-x``)."""
  while _STARTED:
    _STARTED.popitem()[1].kill()


def run_json(module: str, function: str, *, devices: int = 8, timeout: float = 600) -> object:
  """``tests/<module>.py``'s ``function()`` in a child with ``devices`` CPU devices; returns its JSON result.

  The function returns something JSON-serializable; a failure of the child raises with its stderr.
  """
  child = _STARTED.pop((module, function, devices), None) or _Child(_json_code(module, function), devices)
  proc = child.wait(timeout)
  if proc.returncode != 0 or "@@RESULT@@" not in proc.stdout:
    raise RuntimeError(f"{module}.{function} on {devices} CPU devices failed (rc {proc.returncode}):\n"
                       f"{proc.stderr[-6000:]}")
  return json.loads(proc.stdout.rsplit("@@RESULT@@", 1)[1])
