"""One call of each named RoPE-QDQ variant of run44_rope_ab.py, for Nsight Compute (run 44).

  ncu --clock-control none --section SpeedOfLight ... python3 docs/logs/run44_rope_ncu.py MODE WIDTH HEADS now,prefetch_k2
"""
import sys, torch, triton
sys.argv, args = sys.argv[:1] + ["/dev/null"], sys.argv[1:]
src = open("docs/logs/run44_rope_ab.py").read().split("CASES = ")[0]  # the variants, not the timing loop
ns = {"__name__": "ab"}
exec(compile(src, "run44_rope_ab.py", "exec"), ns)
from rope_qdq import MODES
from jqat._src.rope_qdq_reference import MODES as SPEC_MODES
mode, width, heads, names = args[0], int(args[1]), int(args[2]), args[3].split(",")
kw = MODES[mode][0]
rows = 1 << 20
x = torch.randn(rows, width, device="cuda").to(torch.bfloat16)
pos = torch.randint(0, 65536, (rows // heads,), device="cuda", dtype=torch.int32)
ang = torch.rand(65536, 32, device="cuda") * 100
cache = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).contiguous()
dst = torch.empty_like(x)
for name in names:
  if name == "copy":  # the baseline: a device-to-device copy of x
    for _ in range(2):
      dst.copy_(x)
    torch.cuda.synchronize()
    continue
  mod, chans, nw, nst, per_sm, extra = ns["VARIANTS"][name]
  block_r = max(1, chans // width)
  n_blk = triton.cdiv(rows, block_r)
  grid = (n_blk if per_sm is None else min(n_blk, ns["SMS"] * per_sm),)
  for _ in range(2):
    mod.rope_qdq_kernel[grid](x, cache, pos, rows, 65536, heads, x, D=width, GROUP=kw["group_size"],
                              FP8=kw["quantization"] == "fp8", E4M3_SCALE=kw["scale_format"] == "e4m3",
                              AMAX_FLOOR=SPEC_MODES[(kw["quantization"], kw["group_size"], kw["scale_format"])].floor,
                              num_warps=nw, num_stages=nst,
                              **{**{k: v for k, v in mod.launch_config(width, True).items()
                                    if k not in ("num_warps", "num_stages")}, "BLOCK_R": block_r, **extra})
  torch.cuda.synchronize()
  print(name, "grid", grid[0], flush=True)
