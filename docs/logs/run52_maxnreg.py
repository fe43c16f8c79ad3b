"""Run 52b (prepared in session 21, not yet run): four programs of the O-alone forward per SM at D <= 64.

Offline (sm_90a, Triton's ptxas): the O-alone kernel at D = 64 on 64 rows / 4 warps takes 163 registers, so three
programs share an SM. With Triton's ``maxnreg=128`` it takes 128 with no spill in its loops (8 B of stack outside
them) at 3 stages, 56 KB of shared memory each (4 x (56 + 1 reserved) KB = the SM's 228 KB, if the driver grants
it); at 2 stages 40 KB each, but 3 spill loads per unmasked iteration. jax-triton 0.3.1 cannot pass ``maxnreg``, so
this measures it through the torch binding (Triton's own launcher, which takes it as a launch option), ``jt.attention``
under no_grad (``jqat::attention_out``: the quantize pass and the forward), CUDA events, medians, alternated twice;
outputs hashed (register allocation must not change a bit) and the compiled kernels' registers, spills and achieved
occupancy reported.
  python3 docs/logs/run52_maxnreg.py OUT.json"""
import hashlib, json, sys
import torch
sys.path.insert(0, "benchmarks")
from _timing import cuda_event_ms
import jqat.torch as jt
from jqat.ffi import plan as plans
from jqat.ffi import torch_launch

SHAPES = [(2, 16, 4096, 64, False), (2, 16, 4096, 64, True), (1, 16, 16384, 64, False), (2, 16, 4096, 32, False)]
VARIANTS = {"default": (None, None), "maxnreg128": (128, None), "maxnreg128_2stages": (128, "num_stages=2")}
_launch_all, seen = torch_launch._launch_all, {}


def patched(maxnreg):
  def launch_all(plan, tensors, warmup):
    import triton
    triton.set_allocator(torch_launch._scratch)  # as torch_launch._launch_all (no descriptors at D <= 64 anyway)
    for launch in plan.launches:
      args = tuple(tensors[a.name] if isinstance(a, plans.Ref) else a for a in launch.args)
      args += tuple(tensors[o] for o in launch.outputs)
      kwargs = dict(launch.constexprs, num_warps=launch.num_warps, num_stages=launch.num_stages)
      if maxnreg and "attention_fwd" in launch.name:
        kwargs["maxnreg"] = maxnreg
      kernel = launch.kernel[launch.grid](*args, **kwargs)
      if kernel is not None and "attention_fwd" in launch.name and launch.name not in seen:  # None: interpreter
        seen[launch.name] = dict(n_regs=kernel.n_regs, n_spills=kernel.n_spills, shared=kernel.metadata.shared)
  return launch_all


rows = []
torch.manual_seed(0)
for rnd in range(2):
  for b, h, s, d, causal in SHAPES:
    q, k, v = (torch.randn(b, h, s, d, device="cuda").to(torch.bfloat16) for _ in range(3))
    for name, (maxnreg, config) in VARIANTS.items():
      plans.set_config_override("fwd", config)
      torch_launch._launch_all = patched(maxnreg)
      seen.clear()
      try:
        with torch.no_grad():
          o = jt.attention(q, k, v, is_causal=causal)
          ms = cuda_event_ms(lambda: jt.attention(q, k, v, is_causal=causal), iters=10, repeats=5)
        row = dict(round=rnd, shape=[b, h, s, d, causal], variant=name, ms=round(ms, 4),
                   sha=hashlib.sha256(o.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16],
                   kernels=dict(seen))
      except Exception as e:  # noqa: BLE001
        row = dict(round=rnd, shape=[b, h, s, d, causal], variant=name, error=f"{type(e).__name__}: {str(e)[:200]}")
      finally:
        torch_launch._launch_all = _launch_all
        plans.set_config_override("fwd", None)
      print(json.dumps(row), flush=True)
      rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
