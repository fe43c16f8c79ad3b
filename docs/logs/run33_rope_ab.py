"""Interleaved A/B of rope-qdq kernel variants in one process (CUDA events), issue 13's cases."""
import importlib.util, json, statistics, sys, torch, triton
sys.path.insert(0, "benchmarks")
from _timing import cuda_event_ms
from rope_qdq import MODES

def load(name, path):
  spec = importlib.util.spec_from_file_location(name, path)
  m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

variants = {"before": (load("rope_before", ".device/rope_qdq_before.py"), 8192, 64),
            "hints": (load("rope_hints", ".device/rope_qdq_hintsA.py"), 8192, 64),
            "now": (load("rope_now", "kernels_triton/rope_qdq.py"), None, None)}
CASES = (("fp4/32/ue8m0", 128, 1), ("fp4/32/ue8m0", 128, 4), ("fp8/32/ue8m0", 512, 1), ("fp4/16/e4m3", 512, 1))
out = []
for mode, width, heads in CASES:
  kw = MODES[mode][0]
  rows = 1 << 20
  x = torch.randn(rows, width, device="cuda").to(torch.bfloat16)
  pos = torch.randint(0, 65536, (rows // heads,), device="cuda", dtype=torch.int32)
  ang = torch.rand(65536, 32, device="cuda") * 100
  cache = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).contiguous()
  fp8 = kw["quantization"] == "fp8"; e4m3 = kw["scale_format"] == "e4m3"
  floor = 6 * 2.0**-126
  fns = {}
  for name, (mod, chans, _) in variants.items():
    cfg = mod.launch_config(width, True)
    nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
    grid = (triton.cdiv(rows, cfg["BLOCK_R"]),)
    fns[name] = (lambda mod=mod, cfg=cfg, nw=nw, ns=ns, grid=grid: mod.rope_qdq_kernel[grid](
        x, cache, pos, rows, 65536, heads, x, D=width, GROUP=kw["group_size"], FP8=fp8, E4M3_SCALE=e4m3,
        AMAX_FLOOR=floor, num_warps=nw, num_stages=ns, **cfg))
  dst = torch.empty_like(x)
  fns["copy"] = lambda: dst.copy_(x)
  times = {n: [] for n in fns}
  for _ in range(7):
    for n, f in fns.items():
      times[n].append(cuda_event_ms(f, iters=20, repeats=3))
  med = {n: statistics.median(t) for n, t in times.items()}
  r = dict(mode=mode, width=width, heads=heads, ms=med, copy_fraction={n: med["copy"] / med[n] for n in variants})
  out.append(r)
  print(mode, width, heads, " ".join(f"{n} {med[n]:.4f} ms ({100 * med['copy'] / med[n]:.1f}%)" for n in variants),
        f"copy {med['copy']:.4f}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
