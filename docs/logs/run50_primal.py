"""Run 50 (session 20): the forward without residuals (the primal of jqat.attention: O alone, no O' product, no
lse) against the forward with them (attention_forward's O), and cuDNN's forward, in one process; then launch
configurations of the new kernel. Issue 13's shapes, bf16, every switch on, ms (benchmarks/attention.py's time_ms).
  python3 docs/logs/run50_primal.py ab OUT.json        # rows 0-7: residuals / primal / cuDNN, twice alternated
  python3 docs/logs/run50_primal.py sweep OUT.json CONFIG ...   # the primal under each "field=int,..." config
  python3 docs/logs/run50_primal.py primal OUT.json 0,1,7        # the primal alone on those rows (run 50b)"""
import json, sys
import jax, jax.numpy as jnp
sys.path.insert(0, "benchmarks")
from attention import FULL as SHAPES, time_ms
import jqat
from jqat.ffi import plan as plans


def inputs(b, n, kh, s, d):
  ks = jax.random.split(jax.random.key(0), 3)
  return tuple(jax.random.normal(kk, (b, s, h, d), jnp.float32).astype(jnp.bfloat16)
               for kk, h in zip(ks, (n, kh, kh)))


def fns(causal):
  return {
      "residuals": jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, is_causal=causal,
                                                                  implementation="triton")[0]),
      "primal": jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="triton")),
      "cudnn": jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                    implementation="cudnn")),
  }


mode, out = sys.argv[1], sys.argv[2]
rows = []
if mode == "ab":
  for i, (b, n, kh, s, d, causal) in enumerate(SHAPES):
    args, row = inputs(b, n, kh, s, d), dict(row=i, B=b, N=n, K=kh, S=s, D=d, causal=causal)
    f = fns(causal)
    for rnd in range(2):
      for name, fn in f.items():
        row.setdefault(name, []).append(round(time_ms(fn, args, 10, 5), 4))
    row["primal_vs_residuals"] = round(min(row["primal"]) / min(row["residuals"]), 3)
    row["primal_vs_cudnn"] = round(min(row["primal"]) / min(row["cudnn"]), 3)
    print(json.dumps(row), flush=True)
    rows.append(row)
elif mode == "primal":
  for i in map(int, sys.argv[3].split(",")):
    b, n, kh, s, d, causal = SHAPES[i]
    row = dict(row=i, primal_ms=round(time_ms(fns(causal)["primal"], inputs(b, n, kh, s, d), 10, 5), 4))
    print(json.dumps(row), flush=True)
    rows.append(row)
else:
  for config in sys.argv[3:]:
    plans.set_config_override("fwd", None if config == "default" else config)
    for i in (0, 1, 3, 7):
      b, n, kh, s, d, causal = SHAPES[i]
      try:
        ms = round(time_ms(fns(causal)["primal"], inputs(b, n, kh, s, d), 10, 5), 4)
      except Exception as e:  # noqa: BLE001
        ms = f"{type(e).__name__}: {str(e)[:100]}"
      row = dict(config=config, row=i, S=s, causal=causal, primal_ms=ms)
      print(json.dumps(row), flush=True)
      rows.append(row)
json.dump(rows, open(out, "w"), indent=1)
