"""Runs test code on 8 virtual CPU devices in a fresh process.

XLA fixes the number of host devices when the backend starts, so a test process that
already initialized JAX with one device cannot get eight: the code runs in a child
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json(module: str, function: str, *, devices: int = 8, timeout: float = 600) -> object:
  """``tests/<module>.py``'s ``function()`` in a child with ``devices`` CPU devices; returns its JSON result.

  The function returns something JSON-serializable; a failure of the child raises with its stderr.
  """
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
  env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS") or "cpu"
  env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), env.get("PYTHONPATH", "")])
  code = (f"import json, sys, {module}\n"
          f"result = {module}.{function}()\n"
          f"sys.stdout.write('\\n@@RESULT@@' + json.dumps(result))\n")
  proc = subprocess.run([sys.executable, "-c", code], check=False, env=env, cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)
  if proc.returncode != 0 or "@@RESULT@@" not in proc.stdout:
    raise RuntimeError(f"{module}.{function} on {devices} CPU devices failed (rc {proc.returncode}):\n"
                       f"{proc.stderr[-6000:]}")
  return json.loads(proc.stdout.rsplit("@@RESULT@@", 1)[1])
