"""Run 46: the forward kernel with TMA descriptors for every head dim and mask, offline (sm_90a, Triton's bundled
ptxas): does ptxas build it (it died with SIGSEGV at D = 16 and 32 before the D_PAD >= 64 gate), does it serialize
the wgmma, does it spill? One line per case. Run from the repository root: python3 docs/logs/run46_fwd_scan.py [NAME ...]
(only the cases whose names contain one of the NAMEs, e.g. "tensor d192")."""
import os, subprocess, sys, tempfile
sys.path.insert(0, "benchmarks")
from sass_stats import compile_launch, _bin
from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions


def check(name, d=128, seq=4096, heads=16, kvh=16, masks=(), dtype="bfloat16", **kw):
  if len(sys.argv) > 1 and not any(a in name for a in sys.argv[1:]):
    return
  q = P.Tensor.dense((1, seq, heads, d), dtype); k = P.Tensor.dense((1, seq, kvh, d), dtype)
  lens = P.Tensor.dense((1,), "int32"); seg = P.Tensor.dense((1, seq), "int32")
  mk = {"q_len": lens, "kv_len": lens, "q_seg": seg, "kv_seg": seg}
  mask_ops = tuple(mk[n] if n in masks else None for n in P.MASK_OPERANDS)
  plan = P.attention_forward(q, k, k, AttentionOptions(scale=d ** -0.5, **kw), P.Target((9, 0)), masks=mask_ops)
  (launch,) = [l for l in plan.launches if "attention_fwd" in l.name]
  try:
    kern = compile_launch(plan, launch, 90)
  except Exception as e:  # noqa: BLE001
    print(f"{name:28s} FAILED {type(e).__name__}: {str(e).splitlines()[0][:80]}", flush=True)
    return
  with tempfile.TemporaryDirectory() as tmp:  # private files: two scans may run side by side
    ptx = os.path.join(tmp, "k.ptx")
    open(ptx, "w").write(kern.asm["ptx"])
    r = subprocess.run([_bin("ptxas"), "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "k.cubin")],
                       capture_output=True, text=True)
  stack = [l for l in r.stderr.splitlines() if "stack frame" in l]
  print(f"{name:28s} {'SERIAL' if 'serialized' in r.stderr else 'ok'} scratch={kern.metadata.global_scratch_size} "
        f"{stack[0].strip() if stack else r.stderr[-80:]}", flush=True)


for d in range(16, 257, 16):
  check(f"full d{d}", d=d)
for d in (64, 80, 128, 192, 256):
  check(f"causal d{d}", d=d, is_causal=True)
  check(f"segments d{d}", d=d, masks=("q_seg", "kv_seg"))
  check(f"lens causal d{d}", d=d, is_causal=True, masks=("q_len", "kv_len"))
  check(f"row d{d}", d=d, p_scale="row")
  check(f"tensor d{d}", d=d, qkv_scale="tensor")
for d in (192, 256):
  check(f"segments causal d{d}", d=d, is_causal=True, masks=("q_seg", "kv_seg"))
  check(f"window d{d}", d=d, is_causal=True, local_window_size=(1023, 0))
  check(f"gqa causal d{d}", d=d, heads=32, kvh=8, is_causal=True)
check("gqa causal d128", heads=32, kvh=8, is_causal=True)
check("fp16 d128", dtype="float16")
check("fp32 d64", d=64, dtype="float32")
