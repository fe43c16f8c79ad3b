"""Run 49 (prepared in session 19): run47_interp_bits.py's cases through the backward too (dQ, dK, dV hashes beside
O, O', lse), under Triton's interpreter (callback launcher on CPU), for the tree on PYTHONPATH; compare two trees:
  PYTHONPATH=TREE:TREE/tests python3 docs/logs/run49_interp_bits_bwd.py OUT.json"""
import hashlib, os, sys, json
os.environ["TRITON_INTERPRET"] = "1"; os.environ["JQAT_JAX_LAUNCHER"] = "callback"
import numpy as np, jax, jax.numpy as jnp
from jqat.ffi import jax_launch
import test_attention_triton  # noqa: F401  (its NumPy >= 2.4 fix of the interpreter)
from jqat.ffi.options import AttentionOptions, DEFAULT_BLOCK_N

def h(x):
  return hashlib.sha256(np.asarray(x).tobytes()).hexdigest()[:12]

out = {}
for name, (b, tq, tk, n, kh, d, kw, lens, seg) in {
    "window_lens_d128": (2, 150, 150, 2, 1, 128, dict(is_causal=True, local_window_size=(40, 0)), True, False),
    "causal_lens_d128": (2, 130, 170, 2, 2, 128, dict(is_causal=True), True, False),
    "full_ragged_d80": (1, 70, 99, 2, 1, 80, {}, False, False),
    "segments_d128": (1, 160, 160, 2, 1, 128, {}, False, True),
    "window_d256": (1, 140, 140, 1, 1, 256, dict(is_causal=True, local_window_size=(50, 0)), False, False),
    "lens_d256": (2, 100, 130, 1, 1, 256, {}, True, False),
}.items():
  ks = jax.random.split(jax.random.key(3), 3)
  q = jax.random.normal(ks[0], (b, tq, n, d), jnp.float32).astype(jnp.bfloat16)
  k = jax.random.normal(ks[1], (b, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  v = jax.random.normal(ks[2], (b, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  masks = [None] * 4
  if lens:
    masks[0] = jnp.array([tq, tq - 37][:b], jnp.int32); masks[1] = jnp.array([tk - 5, tk - 61][:b], jnp.int32)
  if seg:
    s = (jnp.arange(tq, dtype=jnp.int32) // 70)[None]; masks[2] = s; masks[3] = s
  opts = AttentionOptions(d ** -0.5, DEFAULT_BLOCK_N, **kw) if False else AttentionOptions(scale=d ** -0.5, **kw)
  o, o_hp, lse = jax.jit(lambda q, k, v, m: jax_launch.attention_forward(q, k, v, opts, tuple(m)))(q, k, v, masks)
  do = jax.random.normal(jax.random.key(4), q.shape, jnp.float32).astype(jnp.bfloat16)
  dq, dk, dv = jax.jit(lambda do, q, k, v, o_hp, lse, m: jax_launch.attention_backward(do, q, k, v, o_hp, lse, opts,
                                                                                       tuple(m)))(do, q, k, v, o_hp,
                                                                                                  lse, masks)
  out[name] = {"O": h(o), "O'": h(o_hp), "lse": h(lse), "dQ": h(dq), "dK": h(dk), "dV": h(dv),
               "finite": bool(all(np.isfinite(np.asarray(x, np.float32)).all() for x in (o, dq, dk, dv)))}
  print(name, out[name], flush=True)
json.dump(out, open(sys.argv[1], "w"))
