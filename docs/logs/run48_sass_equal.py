"""Run 48 (session 19): are this tree's forward kernels the ones the H200 measured? Offline SASS (sm_90a, Triton's
bundled ptxas and cuobjdump) of the forward launch per named case (masks included, unlike run46_sass_equal.py), one
line each with the instruction count and a hash of the instructions (addresses and comments dropped). Run in each
tree and compare the lines:  (cd TREE && python3 /path/to/run48_sass_equal.py [NAME ...])"""
import hashlib, os, re, subprocess, sys, tempfile
sys.path.insert(0, "benchmarks")
from sass_stats import compile_launch, _bin
from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions

CASES = {
    "full d128": dict(), "causal d128": dict(is_causal=True), "full d256": dict(d=256),
    "causal d256": dict(d=256, is_causal=True), "causal d64": dict(d=64, is_causal=True),
    "lens causal d128": dict(is_causal=True, masks=("q_len", "kv_len")), "lens d128": dict(masks=("kv_len",)),
    "gqa causal d128": dict(heads=32, kvh=8, is_causal=True), "row causal d128": dict(is_causal=True, p_scale="row"),
    "tensor d128": dict(qkv_scale="tensor"),
    "segments d128": dict(masks=("q_seg", "kv_seg")), "segments causal d128": dict(is_causal=True,
                                                                                  masks=("q_seg", "kv_seg")),
    "segments d256": dict(d=256, masks=("q_seg", "kv_seg")),
    "window d128": dict(is_causal=True, local_window_size=(1023, 0)),
    "window lens d128": dict(is_causal=True, local_window_size=(1023, 0), masks=("kv_len",)),
    "window d256": dict(d=256, is_causal=True, local_window_size=(1023, 0)),
    "window segments d128": dict(is_causal=True, local_window_size=(511, 0), masks=("q_seg", "kv_seg")),
}
for name, kw in CASES.items():
  if len(sys.argv) > 1 and not any(a in name for a in sys.argv[1:]):
    continue
  kw = dict(kw)
  d, heads, kvh, masks = kw.pop("d", 128), kw.pop("heads", 16), kw.pop("kvh", 16), kw.pop("masks", ())
  q = P.Tensor.dense((1, 4096, heads, d), "bfloat16"); k = P.Tensor.dense((1, 4096, kvh, d), "bfloat16")
  lens = P.Tensor.dense((1,), "int32"); seg = P.Tensor.dense((1, 4096), "int32")
  mk = {"q_len": lens, "kv_len": lens, "q_seg": seg, "kv_seg": seg}
  mask_ops = tuple(mk[n] if n in masks else None for n in P.MASK_OPERANDS)
  plan = P.attention_forward(q, k, k, AttentionOptions(scale=d ** -0.5, **kw), P.Target((9, 0)), masks=mask_ops)
  (launch,) = [la for la in plan.launches if "attention_fwd" in la.name]
  kern = compile_launch(plan, launch, 90)
  with tempfile.TemporaryDirectory() as tmp:
    cubin = os.path.join(tmp, "k.cubin")
    open(cubin, "wb").write(kern.asm["cubin"])
    sass = subprocess.run([_bin("cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
  ins = [m.group(2) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)]
  print(f"{name:22s} scratch={kern.metadata.global_scratch_size} instructions={len(ins)} "
        f"sha256={hashlib.sha256(chr(10).join(ins).encode()).hexdigest()[:12]}", flush=True)
