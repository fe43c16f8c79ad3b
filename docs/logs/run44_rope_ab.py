"""Interleaved A/B of RoPE-QDQ kernel variants in one process (CUDA events), issue 13's cases (run 44).

  python3 docs/logs/run44_rope_ab.py OUT.json

"main" is the kernel of 4946c85 (`git show 4946c85:kernels_triton/rope_qdq.py > .device/rope_qdq_head.py`: the
head as one masked power-of-two tile), "now" kernels_triton/rope_qdq.py (run 44a: the same kernel; run 44b: the head in
tiles of D/2, ..., 64 channels; run 44d: with the position ids and cache rows loaded first), "tiles" the kernel of
0afe15f (the head in tiles), "tail_first" (docs/logs/run44_rope_tail_first.py) also the tail's x with the cache rows;
all one tile per program. From aa2ed14 on, "now" is the gather-first kernel at 8192 channels / 8 warps, and
"now_w4" (4096 / 4) its default; "heads_w4" (run 44h, docs/logs/run44_rope_heads.py) loads one cache row per
position id, shared by its H rows. "persist*" loop over row blocks with Triton's
pipeliner (cp.async into shared memory, NSTAGE stages); "prefetch*" loop over row blocks and load the next
block's x, position ids and cache rows into registers before computing the current one. Every variant's
output is first checked equal, bit for bit, to the first variant's on a fresh copy of x. A second argument
selects variants by name (comma-separated).
"""
import importlib.util, json, statistics, sys, torch, triton
sys.path.insert(0, "benchmarks")
sys.path.insert(0, "docs/logs")  # the variants import run44_rope_base
from _timing import cuda_event_ms
from rope_qdq import MODES
from jqat._src.rope_qdq_reference import MODES as SPEC_MODES

def load(name, path):
  spec = importlib.util.spec_from_file_location(name, path)
  m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

main = load("rope_main", ".device/rope_qdq_head.py")
tiles = load("copy_tiles", "docs/logs/run44_copy_tiles.py")
head_tiles = load("rope_tiles", ".device/rope_tiles.py")  # git show 0afe15f:kernels_triton/rope_qdq.py
tail_first = load("rope_tail_first", "docs/logs/run44_rope_tail_first.py")
heads_mod = load("rope_heads", "docs/logs/run44_rope_heads.py")
now, persist, prefetch = (load("rope_now", "kernels_triton/rope_qdq.py"), load("rope_persist", "docs/logs/run44_rope_persist.py"),
                          load("rope_prefetch", "docs/logs/run44_rope_prefetch.py"))
SMS = torch.cuda.get_device_properties(0).multi_processor_count
# name: (module, channels per program, warps, stages, programs per SM (None: one tile each), extra constexprs)
VARIANTS = {
  "main": (main, 8192, 8, 2, None, {}),
  "now": (now, 8192, 8, 2, None, {}),
  "now_w4": (now, 4096, 4, 2, None, {}),
  "tiles": (head_tiles, 8192, 8, 2, None, {}),
  "tail_first": (tail_first, 8192, 8, 2, None, {}),
  "heads_w4": (heads_mod, 4096, 4, 2, None, dict(HEADS="H")),  # "H": the case's heads per position id
  # diagnostics (run 44c): the kernel's loads and stores without its arithmetic; not compared bit for bit
  "io_tiles": (tiles, 8192, 8, 2, None, {}),
  "io_rows": (tiles, 8192, 8, 2, None, dict(WHOLE_ROWS=True)),
  "io_tiles_gather": (tiles, 8192, 8, 2, None, dict(GATHER=True)),
  "persist2_k4": (persist, 8192, 8, 2, 4, dict(NSTAGE=2)),
  "persist3_k4": (persist, 8192, 8, 3, 4, dict(NSTAGE=3)),
  "persist2_w4_k8": (persist, 4096, 4, 2, 8, dict(NSTAGE=2)),
  "prefetch_k2": (prefetch, 8192, 8, 1, 2, {}),
  "prefetch_w4_k4": (prefetch, 4096, 4, 1, 4, {}),
  "prefetch_w4_k5": (prefetch, 4096, 4, 1, 5, {}),
}
if len(sys.argv) > 2:
  VARIANTS = {k: v for k, v in VARIANTS.items() if k in sys.argv[2].split(",")}
CASES = (("fp4/32/ue8m0", 128, 1), ("fp4/32/ue8m0", 128, 4), ("fp8/32/ue8m0", 512, 1), ("fp4/16/e4m3", 512, 1))
out = []
for mode, width, heads in CASES:
  kw = MODES[mode][0]
  rows = 1 << 20
  g = torch.Generator(device="cuda").manual_seed(width + heads)
  x = torch.randn(rows, width, device="cuda", generator=g).to(torch.bfloat16)
  pos = torch.randint(0, 65536, (rows // heads,), device="cuda", dtype=torch.int32, generator=g)
  ang = torch.rand(65536, 32, device="cuda", generator=g) * 100
  cache = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).contiguous()
  fp8 = kw["quantization"] == "fp8"; e4m3 = kw["scale_format"] == "e4m3"
  floor = SPEC_MODES[(kw["quantization"], kw["group_size"], kw["scale_format"])].floor
  fns, ref = {}, None
  for name, (mod, chans, nw, ns, per_sm, extra) in VARIANTS.items():
    block_r = max(1, chans // width)
    cfg = {**mod.launch_config(width, True), "BLOCK_R": block_r,
           **{k: heads if v == "H" else v for k, v in extra.items()}}
    del cfg["num_warps"], cfg["num_stages"]
    n_blk = triton.cdiv(rows, block_r)
    grid = (n_blk if per_sm is None else min(n_blk, SMS * per_sm),)
    def fn(x_, mod=mod, cfg=cfg, nw=nw, ns=ns, grid=grid):
      mod.rope_qdq_kernel[grid](x_, cache, pos, rows, 65536, heads, x_, D=width, GROUP=kw["group_size"], FP8=fp8,
                                E4M3_SCALE=e4m3, AMAX_FLOOR=floor, num_warps=nw, num_stages=ns, **cfg)
    y = x.clone(); fn(y); torch.cuda.synchronize()
    if ref is None:
      ref = y
    same = name.startswith("io_") or bool(torch.equal(y.view(torch.int16), ref.view(torch.int16)))
    print(f"{mode} {width} H={heads} {name}: grid {grid[0]}, BLOCK_R {block_r}, bitwise equal to now: {same}", flush=True)
    if not same:
      continue
    fns[name] = lambda fn=fn: fn(x)
  dst = torch.empty_like(x)
  fns["copy"] = lambda: dst.copy_(x)
  times = {n: [] for n in fns}
  for _ in range(5):
    for n, f in fns.items():
      times[n].append(cuda_event_ms(f, iters=20, repeats=3))
  med = {n: statistics.median(t) for n, t in times.items()}
  r = dict(mode=mode, width=width, heads=heads, ms=med, copy_fraction={n: med["copy"] / med[n] for n in fns if n != "copy"})
  out.append(r)
  print(mode, width, heads, " ".join(f"{n} {med[n]:.4f} ({100 * med['copy'] / med[n]:.1f}%)" for n in fns if n != "copy"),
        f"copy {med['copy']:.4f}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
