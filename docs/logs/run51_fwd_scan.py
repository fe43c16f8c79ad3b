"""Run 51 (session 21): the forward at D <= 64 on its new launch configuration (64 rows, 4 warps, 3 stages), offline
(sm_90a, Triton's bundled ptxas): does it build, serialize its wgmma, spill, and how many registers (three programs
of 4 warps share an SM at <= 168)? Both entry points: with residuals (training) and O alone (the primal).
  python3 docs/logs/run51_fwd_scan.py"""
import os, re, subprocess, sys, tempfile
sys.path.insert(0, "benchmarks")
from sass_stats import compile_launch, _bin
from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions


def check(name, d, masks=(), residuals=True, **kw):
  q = P.Tensor.dense((1, 4096, 16, d), "bfloat16")
  lens = P.Tensor.dense((1,), "int32"); seg = P.Tensor.dense((1, 4096), "int32")
  mk = {"q_len": lens, "kv_len": lens, "q_seg": seg, "kv_seg": seg}
  mask_ops = tuple(mk[n] if n in masks else None for n in P.MASK_OPERANDS)
  plan = P.attention_forward(q, q, q, AttentionOptions(scale=d ** -0.5, **kw), P.Target((9, 0)), masks=mask_ops,
                             residuals=residuals)
  (launch,) = [l for l in plan.launches if "attention_fwd" in l.name]
  try:
    kern = compile_launch(plan, launch, 90)
  except Exception as e:  # noqa: BLE001
    print(f"{name:36s} FAILED {type(e).__name__}: {str(e).splitlines()[0][:80]}", flush=True)
    return
  with tempfile.TemporaryDirectory() as tmp:
    ptx = os.path.join(tmp, "k.ptx")
    open(ptx, "w").write(kern.asm["ptx"])
    r = subprocess.run([_bin("ptxas"), "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "k.cubin")],
                       capture_output=True, text=True)
  regs = re.search(r"Used (\d+) registers", r.stderr)
  stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
  print(f"{name:36s} {'SERIAL' if 'serialized' in r.stderr else 'ok'} block_m={launch.constexprs.get('BLOCK_M')} "
        f"warps={launch.num_warps} registers={regs and regs.group(1)} stack/spill st/ld={stack and stack.groups()}", flush=True)


for residuals in (True, False):
  tag = "residuals" if residuals else "O alone"
  for d in (16, 32, 48, 64):
    check(f"{tag} full d{d}", d, residuals=residuals)
  for name, kw, masks in (("causal", dict(is_causal=True), ()), ("lengths", {}, ("q_len", "kv_len")),
                          ("segments", {}, ("q_seg", "kv_seg")), ("window", dict(local_window_size=(255, 0)), ()),
                          ("row", dict(p_scale="row"), ()), ("tensor", dict(qkv_scale="tensor"), ())):
    check(f"{tag} {name} d64", 64, masks, residuals, **kw)
