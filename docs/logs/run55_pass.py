"""Run 55a (session 23): the quantize pass alone (fake_quantize_rows3_kernel over Q, K, V as the forward plans
launch it) against a device-to-device copy of the same bytes; torch CUDA events, medians of 7 x 20 launches.
  python3 docs/logs/run55_pass.py TAG   (prints one JSON line per shape)"""
import json, sys
import torch, triton
from jqat.kernels_triton import nvfp4 as knv

tag = sys.argv[1]
flags = knv.quant_flags(torch.cuda.get_device_capability())


def med(fn, iters=20, reps=7):
  fn(); torch.cuda.synchronize()
  ts = []
  for _ in range(reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
      fn()
    b.record(); torch.cuda.synchronize()
    ts.append(a.elapsed_time(b) / iters)
  return sorted(ts)[len(ts) // 2]


for b, s, n, d in ((8, 1024, 16, 128), (1, 4096, 16, 128), (2, 4096, 16, 64), (1, 16384, 16, 128)):
  g = torch.Generator(device="cuda").manual_seed(0)
  xs = [torch.randn(b * s * n, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3)]
  outs = [torch.empty_like(x) for x in xs]
  rows = b * s * n
  grid, p = knv.fake_quantize_many_launch((rows,) * 3, d)
  consts = {k: v for k, v in p.items() if k not in ("num_warps", "num_stages")}
  launch = lambda: knv.fake_quantize_rows3_kernel[grid](*xs, rows, rows, rows, d, *outs, **consts, **flags,
                                                         num_warps=p["num_warps"], num_stages=p["num_stages"])
  big, big_out = torch.cat(xs), torch.empty(3 * rows, d, device="cuda", dtype=torch.bfloat16)
  ms = med(launch)
  copy_ms = med(lambda: big_out.copy_(big))
  nbytes = 2 * 3 * rows * d * 2
  h = hash(tuple(int(o.view(torch.int16).double().sum().item()) for o in outs))
  print(json.dumps(dict(tree=tag, shape=[b, s, n, d], pass_ms=round(ms, 5), copy_ms=round(copy_ms, 5),
                        pass_tbs=round(nbytes / ms / 1e9, 2), copy_tbs=round(nbytes / copy_ms / 1e9, 2),
                        of_copy=round(copy_ms / ms, 3), checksum=h)), flush=True)
