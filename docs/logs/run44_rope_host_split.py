"""Run 44f: host microseconds per call of each step of RopeQDQInplace.execute on the GPU (perf_counter over 500 calls,
launches left queued; medians of 5): the checks, the plan, torch_launch.execute (Triton's dispatch and launch), a
bare Triton launch of the plan's kernel, and the whole execute()."""
import statistics, sys, time, torch
sys.path.insert(0, "benchmarks")
from rope_qdq import MODES
import jqat.torch as jt
from jqat.torch import vendor
from jqat.ffi import plan as plans, torch_launch

def per_call_us(fn, n=500):
  out = []
  for _ in range(5):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
      fn()
    out.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
  return statistics.median(out)

mode, width, heads = "fp4/32/ue8m0", 128, 1
kw = MODES[mode][0]
rows = 1 << 14  # small: the GPU work must not be what is timed
x = torch.randn(rows, heads, width, device="cuda").to(torch.bfloat16)
pos = torch.randint(0, 65536, (rows,), device="cuda", dtype=torch.int32)
cache = torch.randn(65536, 64, device="cuda")
op = jt.RopeQDQInplace(x, cache, pos, **kw); op.check_support(); op.compile()
m = op.mode
make_plan = lambda: plans.rope_qdq(*(torch_launch.describe(t) for t in (x, cache, pos)), torch_launch.target(x),
                                   heads=1, group=m.group, fp8=m.fp8, e4m3_scale=m.e4m3_scale, amax_floor=m.floor)
plan = make_plan()
(launch,) = plan.launches
tensors = {"x": x, "cache": cache, "positions": pos, "out": x}
args = (x, cache, pos) + tuple(launch.args[3:]) + (x,)
kwargs = dict(launch.constexprs, num_warps=launch.num_warps, num_stages=launch.num_stages)
steps = {
  "check": lambda: op._check_execute(x, cache, pos),
  "describe+target": lambda: (tuple(torch_launch.describe(t) for t in (x, cache, pos)), torch_launch.target(x)),
  "plan (with describe+target)": make_plan,
  "torch_launch.execute": lambda: torch_launch.execute(plan, tensors),
  "kernel[grid](...)": lambda: launch.kernel[launch.grid](*args, **kwargs),
  "execute()": lambda: op.execute(x, cache, pos),
}
for name, fn in steps.items():
  print(f"{name:30} {per_call_us(fn):8.1f} us", flush=True)
