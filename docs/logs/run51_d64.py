"""Run 51b (session 21): launch configurations of the forward at D <= 64, the primal (O alone) and the forward with
residuals, against cuDNN's forward, in one process. Offline (benchmarks/sass_stats.py --batch 2 --head-dim 64
--kernels fwd_out): the default (128 rows, 8 warps, 3 stages) takes 172 registers, so one program of 8 warps per SM;
64 rows on 4 warps take 163, so three programs (12 warps) fit. ms, benchmarks/attention.py's time_ms, bf16.
  python3 docs/logs/run51_d64.py OUT.json CONFIG ...     # "default" or "field=int,..." (plan.set_config_override)"""
import hashlib, json, sys
import jax, jax.numpy as jnp
import numpy as np
sys.path.insert(0, "benchmarks")
from attention import time_ms
import jqat
from jqat.ffi import plan as plans

SHAPES = [(2, 16, 16, 4096, 64, False), (2, 16, 16, 4096, 64, True), (1, 16, 16, 16384, 64, False),
          (2, 16, 16, 4096, 32, False)]


def inputs(b, n, kh, s, d):
  ks = jax.random.split(jax.random.key(0), 3)
  return tuple(jax.random.normal(kk, (b, s, h, d), jnp.float32).astype(jnp.bfloat16)
               for kk, h in zip(ks, (n, kh, kh)))


def fns(causal):
  return {
      "residuals": jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, is_causal=causal,
                                                                  implementation="triton")[0]),
      "primal": jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="triton")),
  }


out, configs = sys.argv[1], sys.argv[2:]
rows = []
data = {shape: inputs(*shape[:5]) for shape in SHAPES}
for rnd in range(2):
  for shape in SHAPES:
    causal = shape[5]
    cudnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn"))
    row = dict(round=rnd, shape=shape, config="cudnn", fwd_ms=round(time_ms(cudnn, data[shape], 10, 5), 4))
    print(json.dumps(row), flush=True)
    rows.append(row)
  for config in configs:
    plans.set_config_override("fwd", None if config == "default" else config)
    for shape in SHAPES:
      row = dict(round=rnd, shape=shape, config=config)
      for name, fn in fns(shape[5]).items():
        try:
          row[name + "_ms"] = round(time_ms(fn, data[shape], 10, 5), 4)
          if rnd == 0:
            row[name + "_sha"] = hashlib.sha256(np.asarray(fn(*data[shape])).tobytes()).hexdigest()[:16]
        except Exception as e:  # noqa: BLE001
          row[name + "_ms"] = f"{type(e).__name__}: {str(e)[:100]}"
      print(json.dumps(row), flush=True)
      rows.append(row)
plans.set_config_override("fwd", None)
json.dump(rows, open(out, "w"), indent=1)
