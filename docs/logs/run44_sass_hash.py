"""Hashes the offline SASS (sm_90) of the attention kernels of seven plans and of the three RoPE-QDQ kernels (run 44).

  python docs/logs/run44_sass_hash.py OUT.json   (no GPU: Triton's bundled ptxas and cuobjdump)
"""
import hashlib, sys, json, subprocess, os, tempfile
sys.path.insert(0, "benchmarks")
import sass_stats as S
from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions
from jqat._src.rope_qdq_reference import MODES
out = {}
def h(k):
    return hashlib.sha256(S.sass_stats(k)["sass"].encode()).hexdigest()[:16]
for args in (["--seq", "4096"], ["--seq", "4096", "--causal"], ["--seq", "16384", "--window", "1024"], ["--seq", "4096", "--head-dim", "64"],
             ["--seq", "4096", "--segments"], ["--seq", "4096", "--p-scale", "row"], ["--seq", "4096", "--qkv-scale", "tensor"]):
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "benchmarks/sass_stats.py", *args, "--sass-dir", d], check=True, capture_output=True)
        for f in sorted(os.listdir(d)):
            out[" ".join(args) + " " + f] = hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()[:16]
for (quant, group, sf), mode in MODES.items():
    rows, width = 1 << 20, mode.width
    plan = P.rope_qdq(P.Tensor.dense((rows, width), "bfloat16"), P.Tensor.dense((65536, 64), "float32"),
                      P.Tensor.dense((rows,), "int32"), P.Target((9, 0)), heads=1, group=group,
                      fp8=mode.fp8, e4m3_scale=mode.e4m3_scale, amax_floor=mode.floor)
    out[f"rope {quant}/{group}/{sf}"] = h(S.compile_launch(plan, plan.launches[0], 90))
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(len(out), "kernels hashed")
