"""Run 46: are the forward kernels of this tree the ones the H200 measured? Offline SASS (sm_90a, Triton's bundled
ptxas and cuobjdump) of the forward launch per (D, causal), one line each with the instruction count and a hash of
the instructions (addresses and comments dropped). Run in each tree and compare the lines:
  (cd TREE && python3 /path/to/run46_sass_equal.py OUT_PREFIX 64:0,64:1,48:0,32:1,16:0)"""
import hashlib, re, subprocess, sys
sys.path.insert(0, "benchmarks")
from sass_stats import compile_launch, _bin
from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions

out = sys.argv[1]
for item in sys.argv[2].split(","):
  d, causal = int(item.split(":")[0]), item.split(":")[1] == "1"
  q = P.Tensor.dense((1, 4096, 16, d), "bfloat16")
  plan = P.attention_forward(q, q, q, AttentionOptions(scale=d ** -0.5, is_causal=causal), P.Target((9, 0)))
  (launch,) = [l for l in plan.launches if "attention_fwd" in l.name]
  kern = compile_launch(plan, launch, 90)
  cubin = f"{out}_{d}_{int(causal)}.cubin"
  open(cubin, "wb").write(kern.asm["cubin"])
  sass = subprocess.run([_bin("cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
  ins = [m.group(2) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)]
  open(f"{out}_{d}_{int(causal)}.sass", "w").write("\n".join(ins))
  print(f"D={d} causal={causal} scratch={kern.metadata.global_scratch_size} instructions={len(ins)} "
        f"sha256={hashlib.sha256(chr(10).join(ins).encode()).hexdigest()[:12]}", flush=True)
