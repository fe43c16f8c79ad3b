"""fwd+bwd step time with the JAX backward's fq(Q) over O' (default) or in scratch (AB_OLD=1), one process each."""
import os, json, time, statistics, functools
import jax, jax.numpy as jnp
import jqat
from jqat.ffi import jax_launch, plan as plans
if os.environ.get("AB_OLD") == "1":
  orig = plans.attention_backward
  jax_launch.plans = type("P", (), {k: getattr(plans, k) for k in dir(plans) if not k.startswith("__")})
  jax_launch.plans.attention_backward = staticmethod(lambda *a, **kw: orig(*a, **{**kw, "q_hat_over_out": False}))
res = {"variant": "scratch" if os.environ.get("AB_OLD") == "1" else "over_o"}
for (b, t, n, d, causal) in [(1, 4096, 16, 128, False), (1, 16384, 16, 128, True), (2, 4096, 16, 64, False)]:
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(kk, (b, t, n, d), jnp.bfloat16) for kk in ks)
  f = jax.jit(jax.grad(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
  jax.block_until_ready(f(q, k, v))
  times = []
  for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(10):
      out = f(q, k, v)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) / 10 * 1e3)
  res[f"{b}x{t}x{n}x{d}{'c' if causal else ''}"] = round(statistics.median(times), 4)
print(json.dumps(res))
