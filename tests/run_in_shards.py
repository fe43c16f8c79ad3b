"""``make test``: the suite as two pytest processes over disjoint sets of test files, side by side.

The CPU suite is mostly single-threaded (XLA compiles one program at a time, the Triton interpreter is
plain Python), so on CI's two cores two sessions take about half the wall time of one. Each shard is an
ordinary pytest session (its own conftest, fixtures and background 8-device children); their outputs are
printed one after the other once both finish, and the exit status is the first failure's (pytest's "no
tests collected" counts as success for a shard that a ``-k`` leaves empty).

  python tests/run_in_shards.py [pytest options]     # e.g. -k masks, -x, --durations=15
  python tests/run_in_shards.py tests/test_masks.py  # explicit paths: one ordinary pytest session

Files are split by the measured cost of each (``FIRST``: the heavy half); new test files go to the other shard.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# About half of the suite's time on 2 cores: the Triton-interpreter mask and kernel sweeps, the 8-device
# sharding child, the demo and the Flax adapter.
FIRST = ("test_masks.py", "test_parallel.py", "test_attention_triton.py", "test_train_lm.py", "test_flax.py",
         "test_nan.py", "test_validation.py", "test_plan.py", "test_packaging.py", "test_parallel_masks.py",
         "test_numerics_modes_triton.py")
NO_TESTS_COLLECTED = 5


def shards() -> tuple[list[str], list[str]]:
  files = sorted(f for f in os.listdir(TESTS) if f.startswith("test_") and f.endswith(".py"))
  first = [os.path.join("tests", f) for f in files if f in FIRST]
  second = [os.path.join("tests", f) for f in files if f not in FIRST]
  return first, second


def main(argv: list[str]) -> int:
  if any(not a.startswith("-") and os.path.exists(a.split("::")[0]) for a in argv):
    return subprocess.call([sys.executable, "-m", "pytest", *argv], cwd=ROOT)
  # Two JAX processes on one GPU must not each take 75% of its memory up front.
  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false")}
  runs = []
  for i, files in enumerate(shards()):
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", *argv, *files], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    runs.append((i + 1, files, log, proc, time.perf_counter()))
  status, summary = 0, []
  for i, files, log, proc, start in runs:
    rc = proc.wait()
    seconds = time.perf_counter() - start
    log.seek(0)
    print(f"==================== shard {i}/{len(runs)}: {len(files)} files, {seconds:.0f} s, exit {rc}")
    print(log.read(), end="", flush=True)
    ok = rc in (0, NO_TESTS_COLLECTED)
    status = status or (0 if ok else rc)
    summary.append(f"shard {i}: {'ok' if ok else f'FAILED (exit {rc})'} in {seconds:.0f} s")
  print("==================== " + "; ".join(summary))
  return status


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
