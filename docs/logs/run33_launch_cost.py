"""Step time of jit(grad) through jqat.attention under the current JQAT_JAX_LAUNCHER (one process per launcher)."""
import os, sys, json, time, statistics
import jax, jax.numpy as jnp
import jqat
res = {"launcher": os.environ.get("JQAT_JAX_LAUNCHER", "jax-triton")}
for (b, t, n, d, causal) in [(1, 1024, 8, 128, True), (8, 1024, 16, 128, True), (1, 4096, 16, 128, False)]:
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(kk, (b, t, n, d), jnp.bfloat16) for kk in ks)
  f = jax.jit(jax.grad(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
  jax.block_until_ready(f(q, k, v))
  times = []
  for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(50):
      out = f(q, k, v)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) / 50 * 1e3)
  res[f"{b}x{t}x{n}x{d}{'c' if causal else ''}"] = statistics.median(times)
print(json.dumps(res))
