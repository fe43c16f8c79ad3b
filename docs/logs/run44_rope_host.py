"""Run 44e: where the benchmark of record (torch_rope_qdq.py, through RopeQDQInplace.execute) loses against a bare
launch of the same kernel (run44_rope_ab.py). Per case, interleaved over 5 rounds: host microseconds per execute()
(perf_counter over 200 calls, then one sync), and CUDA-event ms per call of execute(), of the plan's kernel launched
directly, of 20 execute() calls captured in one CUDA graph, and of the copy.

  python3 docs/logs/run44_rope_host.py OUT.json
"""
import json, statistics, sys, time, torch
sys.path.insert(0, "benchmarks")
from _timing import cuda_event_ms
from rope_qdq import MODES
import jqat.torch as jt
from jqat.ffi import plan as plans, torch_launch

CASES = (("fp4/32/ue8m0", 128, 1), ("fp4/32/ue8m0", 128, 4), ("fp8/32/ue8m0", 512, 1), ("fp4/16/e4m3", 512, 1))
out = []
for mode, width, heads in CASES:
  kw = MODES[mode][0]
  rows = 1 << 20
  g = torch.Generator(device="cuda").manual_seed(rows)
  shape = (rows // heads, heads, width) if MODES[mode][2] > 1 else (rows, width)
  x = torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
  pos = torch.randint(0, 65536, (rows // heads,), device="cuda", generator=g, dtype=torch.int32)
  ang = torch.rand(65536, 32, device="cuda", generator=g) * 100
  cache = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).contiguous()
  op = jt.RopeQDQInplace(x, cache, pos, **kw)
  op.check_support(); op.compile()
  m = op.mode
  plan = plans.rope_qdq(*(torch_launch.describe(t) for t in (x, cache, pos)), torch_launch.target(x), heads=op.heads,
                        group=m.group, fp8=m.fp8, e4m3_scale=m.e4m3_scale, amax_floor=m.floor)
  (launch,) = plan.launches
  args = (x, cache, pos) + tuple(a for a in launch.args[3:]) + (x,)
  kwargs = dict(launch.constexprs, num_warps=launch.num_warps, num_stages=launch.num_stages)
  direct = lambda: launch.kernel[launch.grid](*args, **kwargs)
  execute = lambda: op.execute(x, cache, pos)
  stream = torch.cuda.Stream()
  with torch.cuda.stream(stream):
    execute(); torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
      for _ in range(20):
        execute()
  torch.cuda.synchronize()
  dst = torch.empty_like(x)
  fns = dict(execute=execute, direct=direct, graph20=graph.replay, copy=lambda: dst.copy_(x))
  times = {n: [] for n in fns}
  host = []
  for _ in range(5):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
      execute()
    host.append((time.perf_counter() - t0) / 200 * 1e6)
    torch.cuda.synchronize()
    for n, f in fns.items():
      times[n].append(cuda_event_ms(f, iters=20 if n != "graph20" else 1, repeats=3) / (20 if n == "graph20" else 1))
  med = {n: statistics.median(t) for n, t in times.items()}
  r = dict(mode=mode, width=width, heads=heads, ms=med, host_us_per_execute=statistics.median(host),
           copy_fraction={n: med["copy"] / med[n] for n in fns if n != "copy"})
  out.append(r)
  print(mode, width, heads, f"host {r['host_us_per_execute']:.1f} us/execute;",
        " ".join(f"{n} {med[n]:.4f} ({100 * med['copy'] / med[n]:.1f}%)" for n in fns if n != "copy"),
        f"copy {med['copy']:.4f}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
