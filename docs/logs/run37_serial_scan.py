"""Which attention kernels does ptxas serialize (wgmma waits after every instruction)? Offline, sm_90a."""
import sys, subprocess
sys.path.insert(0, "benchmarks")
from sass_stats import compile_launch, _bin
from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions

def check(name, d=128, seq=4096, heads=16, kvh=16, masks=(), **kw):
  q = P.Tensor.dense((1, seq, heads, d), "bfloat16"); k = P.Tensor.dense((1, seq, kvh, d), "bfloat16")
  st = P.Tensor.dense((1, heads, seq), "float32")
  lens = P.Tensor.dense((1,), "int32"); seg = P.Tensor.dense((1, seq), "int32")
  mk = {"q_len": lens, "kv_len": lens, "q_seg": seg, "kv_seg": seg}
  mask_ops = tuple(mk[n] if n in masks else None for n in P.MASK_OPERANDS)
  opts = AttentionOptions(scale=d ** -0.5, **kw)
  t = P.Target((9, 0))
  row = st if kw.get("p_scale") == "row" else None
  plans = [P.attention_forward(q, k, k, opts, t, masks=mask_ops),
           P.attention_backward(q, q, k, k, q, st, opts, t, masks=mask_ops, row_max=row)]
  out = []
  for plan in plans:
    for l in plan.launches:
      if not any(x in l.name for x in ("attention_fwd", "bwd_dq", "bwd_dkdv")):
        continue
      kern = compile_launch(plan, l, 90)
      open("/tmp/k.ptx", "w").write(kern.asm["ptx"])
      r = subprocess.run([_bin("ptxas"), "-v", "--gpu-name", "sm_90a", "/tmp/k.ptx", "-o", "/tmp/k.cubin"],
                         capture_output=True, text=True)
      out.append(f"{l.name.replace('jqat_attention_', '')}:{'SERIAL' if 'serialized' in r.stderr else 'ok'}")
  print(f"{name:32s}", " ".join(out), flush=True)

cases = sys.argv[1].split(",") if len(sys.argv) > 1 else None
C = {
  "full": dict(), "causal": dict(is_causal=True),
  "window": dict(is_causal=True, local_window_size=(1023, 0)),
  "window_sym": dict(local_window_size=(256, 256)),
  "segments": dict(masks=("q_seg", "kv_seg")), "segments_causal": dict(is_causal=True, masks=("q_seg", "kv_seg")),
  "lens": dict(masks=("q_len", "kv_len")), "lens_causal": dict(is_causal=True, masks=("q_len", "kv_len")),
  "bottom_right": dict(is_causal=True, causal_alignment="bottom_right"),
  "d64": dict(d=64), "d64_causal": dict(d=64, is_causal=True), "d80_causal": dict(d=80, is_causal=True, seq=1000),
  "d256": dict(d=256), "d256_causal": dict(d=256, is_causal=True), "d192": dict(d=192), "gqa_causal": dict(heads=32, kvh=8, is_causal=True),
  "row_causal": dict(is_causal=True, p_scale="row"), "tensor": dict(qkv_scale="tensor"),
  "window_row": dict(is_causal=True, local_window_size=(1023, 0), p_scale="row"),
  "window_tensor": dict(is_causal=True, local_window_size=(1023, 0), qkv_scale="tensor"),
  "window_lens_segments": dict(is_causal=True, local_window_size=(300, 0), masks=("kv_len", "q_seg", "kv_seg")),
  "window_d64": dict(d=64, is_causal=True, local_window_size=(1023, 0)),
}
for name, kw in C.items():
  if cases is None or name in cases:
    check(name, **kw)
