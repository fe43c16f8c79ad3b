"""SASS of the quantize pass (fake_quantize_rows_kernel) of a 16k window forward plan."""
import sys, collections
sys.path.insert(0, "benchmarks")
import sass_stats as S
from jqat.ffi import plan as P
from jqat.ffi.options import AttentionOptions
q = P.Tensor.dense((1, 16384, 16, 128), "bfloat16")
opts = AttentionOptions(scale=128 ** -0.5, is_causal=True, local_window_size=(1023, 0))
plan = P.attention_forward(q, q, q, opts, P.Target((9, 0)))
for la in plan.launches:
  if la.name.endswith("fake_quantize_k"):
    k = S.compile_launch(plan, la, 90, False)
    s = S.sass_stats(k)
    print(la.name, la.constexprs, la.grid, la.num_warps, "regs", s["registers"], "instr", s["instructions"])
    body = collections.Counter(S._opcode(t) for t in s["sass"].splitlines() if S._INSTR.match(t) for t in [S._INSTR.match(t).group(2)])
    print(sorted(body.items(), key=lambda kv: -kv[1])[:30])
    if len(sys.argv) > 1:
      open(sys.argv[1], "w").write(s["sass"])
