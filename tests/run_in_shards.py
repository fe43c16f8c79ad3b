"""``make test``: the suite as two pytest processes over disjoint sets of test files, side by side.

The CPU suite is mostly single-threaded (XLA compiles one program at a time, the Triton interpreter is
plain Python), so on CI's two cores two sessions take about half the wall time of one. Each shard is an
ordinary pytest session (its own conftest, fixtures and background 8-device children); their outputs are
printed one after the other once both finish, and the exit status is the first failure's (pytest's "no
tests collected" counts as success for a shard that a ``-k`` leaves empty).

  python tests/run_in_shards.py [pytest options]     # e.g. -k masks, -x, --durations=15
  python tests/run_in_shards.py tests/test_masks.py  # explicit paths: one ordinary pytest session
  python tests/run_in_shards.py -m "not slow_interpreter"  # a quick run without the interpreter's slow cases

Files are split by their measured cost (``SECONDS``): longest first, each to the shard with less work so far. A
file missing from the table (a new one) counts as ``NEW_FILE_SECONDS`` and so lands on the lighter shard.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# Seconds per file on a 2-core machine with both shards running (the sum of its tests' --durations=0). The
# 8-device children of test_parallel.py and test_shard_map_xla.py run beside both shards and are not counted.
# Re-measure when a file's cost moves by more than ~30 s.
SECONDS = {
    "test_callback_launch.py": 196, "test_attention_reference.py": 151, "test_numerics_modes.py": 114,
    "test_nan.py": 90, "test_masks.py": 86, "test_decode.py": 85, "test_attention_triton.py": 75, "test_torch.py": 61,
    "test_flax.py": 48, "test_nvfp4.py": 42, "test_large_logits.py": 42, "test_tile_ranges.py": 39,
    "test_plan.py": 37, "test_grad_fidelity.py": 35, "test_nvfp4_pallas.py": 34, "test_qat_matmul.py": 31,
    "test_rope_qdq.py": 31, "test_properties.py": 30, "test_ffi.py": 29, "test_train_lm.py": 26,
    "test_parallel.py": 22, "test_readme.py": 20, "test_validation.py": 11, "test_bench_numerics.py": 9,
    "test_packaging.py": 4, "test_nvfp4_triton.py": 4, "test_bench_fastvideo.py": 3, "test_report.py": 1,
    "test_parallel_masks.py": 1, "test_shard_map_xla.py": 1,
}
NEW_FILE_SECONDS = 30
NO_TESTS_COLLECTED = 5


def shards() -> tuple[list[str], list[str]]:
  files = sorted(f for f in os.listdir(TESTS) if f.startswith("test_") and f.endswith(".py"))
  cost = lambda f: SECONDS.get(f, NEW_FILE_SECONDS)
  loads, parts = [0.0, 0.0], ([], [])
  for f in sorted(files, key=lambda f: (-cost(f), f)):  # ties by name: the same split on every machine
    i = loads.index(min(loads))
    loads[i] += cost(f)
    parts[i].append(os.path.join("tests", f))
  return sorted(parts[0]), sorted(parts[1])


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
