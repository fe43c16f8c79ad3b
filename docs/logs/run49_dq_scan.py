"""Run 49 (prepared in session 19): run46_fwd_scan.py for the dQ kernel (docs/logs/run49_dq_tma.patch: its K/V
tiles by TMA), offline (sm_90a, Triton's bundled ptxas): does ptxas build it, does it serialize the wgmma, does it
spill? One line per case. Run from the repository root: python3 docs/logs/run49_dq_scan.py [NAME ...]
(KERNEL=attention_bwd_dkdv in the environment: the dK/dV kernel instead)."""
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
  lse = P.Tensor.dense((1, heads, seq), "float32")
  opts = AttentionOptions(scale=d ** -0.5, **kw)
  row_max = lse if opts.p_scale == "row" else None
  plan = P.attention_backward(q, q, k, k, q, lse, opts, P.Target((9, 0)), masks=mask_ops, row_max=row_max)
  (launch,) = [l for l in plan.launches if l.name.endswith(os.environ.get("KERNEL", "attention_bwd_dq"))]
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
for d in (144, 160, 192, 224, 256):  # the window above D = 128 (serialized on main, found in session 19)
  check(f"window wide d{d}", d=d, is_causal=True, local_window_size=(1023, 0))
  check(f"window wide row d{d}", d=d, is_causal=True, local_window_size=(255, 0), p_scale="row")
  check(f"window wide tensor lens d{d}", d=d, is_causal=True, local_window_size=(300, 0), qkv_scale="tensor",
        masks=("q_len", "kv_len"))
  check(f"window wide gqa sym d{d}", d=d, heads=32, kvh=8, local_window_size=(200, 200))
  check(f"window wide segments d{d}", d=d, is_causal=True, local_window_size=(511, 0), masks=("q_seg", "kv_seg"))
