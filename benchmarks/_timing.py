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


def graph_replay_ms(launch, calls: int = 40, replays: int = 7) -> float:
  """Median milliseconds per call of ``launch(i)`` (i = 0 .. calls - 1, e.g. cycling over input copies), captured
  into one CUDA graph and timed with CUDA events around each of ``replays`` replays, after a warm-up call and a warm-up
  replay: the kernels' time, without Python's launches."""
  import torch

  launch(0)
  torch.cuda.synchronize()
  graph = torch.cuda.CUDAGraph()
  with torch.cuda.graph(graph):
    for i in range(calls):
      launch(i)
  graph.replay()
  torch.cuda.synchronize()
  times = []
  for _ in range(replays):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) / calls)
  return statistics.median(times)


def kernel_device_ms(launch, calls: int) -> dict:
  """``{kernel name: mean device milliseconds per call}`` of ``launch(i)`` (i = 0 .. calls - 1) under
  ``torch.profiler``, largest first: the time each kernel ran on the GPU, at its normal clocks, not the gaps between
  kernels or Python's launches."""
  from collections import defaultdict

  import torch

  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for i in range(calls):
      launch(i)
    torch.cuda.synchronize()
  total = defaultdict(float)
  for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA:
      total[ev.name] += ev.device_time / 1e3  # us -> ms
  return {name: t / calls for name, t in sorted(total.items(), key=lambda kv: -kv[1])}
