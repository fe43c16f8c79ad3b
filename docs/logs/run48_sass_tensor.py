"""Session 19: the forward SASS (offline, sm_90a) of qkv_scale="tensor" above D = 128, to compare the kept tree with run
47c's measured tensor_qpass tree (2c7a7ce + docs/logs/run47_tensor_qpass.patch). Run in each tree: python3 THIS"""
import hashlib, os, re, subprocess, sys, tempfile
sys.path.insert(0, "benchmarks")
from sass_stats import compile_launch, _bin
from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions
for name, d, kw in (("tensor d192", 192, {}), ("tensor causal d256", 256, {"is_causal": True}),
                    ("tensor row causal d256", 256, {"is_causal": True, "p_scale": "row"})):
  q = P.Tensor.dense((1, 4096, 16, d), "bfloat16")
  plan = P.attention_forward(q, q, q, AttentionOptions(scale=d ** -0.5, qkv_scale="tensor", **kw), P.Target((9, 0)))
  (launch,) = [la for la in plan.launches if "attention_fwd" in la.name]
  kern = compile_launch(plan, launch, 90)
  with tempfile.TemporaryDirectory() as tmp:
    cubin = os.path.join(tmp, "k.cubin"); open(cubin, "wb").write(kern.asm["cubin"])
    sass = subprocess.run([_bin("cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
  ins = [m.group(2) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)]
  print(f"{name:24s} {len(ins)} {hashlib.sha256(chr(10).join(ins).encode()).hexdigest()[:12]}", flush=True)
