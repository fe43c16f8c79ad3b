# Run-13b timing probe, kept as run. It used benchmarks/rope_qdq.py as it was then, whose `_looped(step, k)`
# was `jax.jit(lambda x, c, p: lax.fori_loop(0, k, lambda i, x: step(x, c, p), x, unroll=True), donate_argnums=0)`;
# the benchmark has since replaced it with the two-point slope timing.
import sys, time, statistics, os
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.getcwd() + "/benchmarks")
import jax, jax.numpy as jnp
import rope_qdq as b
from jqat._src.rope_qdq import rope_qdq
for mode in ["fp4/32/ue8m0", "fp8/32/ue8m0"]:
  kw = b.MODES[mode][0]
  x, c, p, nbytes = b._inputs(mode, 1 << 20, jax.random.PRNGKey(1))
  step = lambda x, c, p: rope_qdq(x, c, p, **kw, implementation="triton")
  f = jax.jit(step, donate_argnums=0)
  x = f(jnp.copy(x), c, p).block_until_ready()
  for k in (10, 50, 200):
    ts = []
    for _ in range(5):
      t0 = time.perf_counter()
      for _ in range(k):
        x = f(x, c, p)
      x.block_until_ready()
      ts.append((time.perf_counter() - t0) / k)
    print(mode, "dispatch k", k, "%.4f ms" % (statistics.median(ts) * 1e3), flush=True)
  for k in (5, 20, 80):
    g = b._looped(step, k)
    x = g(x, c, p).block_until_ready()
    ts = []
    for _ in range(5):
      t0 = time.perf_counter(); x = g(x, c, p).block_until_ready(); ts.append((time.perf_counter() - t0) / k)
    print(mode, "unrolled k", k, "%.4f ms" % (statistics.median(ts) * 1e3), flush=True)
  print(mode, "hlo of one step:", [l.strip()[:150] for l in f.lower(x, c, p).compile().as_text().splitlines() if "custom-call" in l or "copy" in l or "fusion" in l][:8], flush=True)
