"""Timing shared by the benchmarks that run torch CUDA work."""

from __future__ import annotations

import statistics


def cuda_event_ms(fn, iters: int = 20, repeats: int = 5) -> float:
  """Median milliseconds per call of ``fn()`` on torch's current stream, timed with CUDA events
  around ``iters`` back-to-back calls, ``repeats`` times, after one warm-up call."""
  import torch

  fn()
  torch.cuda.synchronize()
  times = []
  for _ in range(repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
      fn()
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) / iters)
  return statistics.median(times)
