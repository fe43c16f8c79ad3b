"""Run 47 (prepared in session 18): forward bits with qkv_scale="tensor" (O, O', lse and, with p_scale="row", m
hashes) for the tree on PYTHONPATH, to compare two trees:
  PYTHONPATH=TREE:TREE/tests python3 docs/logs/run47_interp_bits_tensor.py OUT.json [--gpu]
Without --gpu, under Triton's interpreter through the callback launcher (CPU); with it, on the GPU (default launcher)."""
import hashlib, os, sys, json
if "--gpu" not in sys.argv:
  os.environ["TRITON_INTERPRET"] = "1"; os.environ["JQAT_JAX_LAUNCHER"] = "callback"
import numpy as np, jax, jax.numpy as jnp
from jqat.ffi import jax_launch
import test_attention_triton  # noqa: F401  (its NumPy >= 2.4 fix of the interpreter)
from jqat.ffi.options import AttentionOptions

def h(x):
  return hashlib.sha256(np.asarray(x).tobytes()).hexdigest()[:12]

out = {}
for name, (b, tq, tk, n, kh, d, kw) in {
    "tensor_d192": (1, 100, 90, 2, 1, 192, dict(qkv_scale="tensor")),
    "tensor_row_causal_d256": (1, 80, 80, 2, 2, 256, dict(qkv_scale="tensor", p_scale="row", is_causal=True)),
    "tensor_d128": (1, 70, 70, 2, 1, 128, dict(qkv_scale="tensor")),
}.items():
  ks = jax.random.split(jax.random.key(5), 3)
  q = (3 * jax.random.normal(ks[0], (b, tq, n, d), jnp.float32)).astype(jnp.bfloat16)
  k = jax.random.normal(ks[1], (b, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  v = jax.random.normal(ks[2], (b, tk, kh, d), jnp.float32).astype(jnp.bfloat16)
  opts = AttentionOptions(scale=d ** -0.5, **kw)
  res = jax.jit(lambda q, k, v: jax_launch.attention_forward(q, k, v, opts))(q, k, v)
  out[name] = {f"out{i}": h(r) for i, r in enumerate(res)}
  print(name, out[name], flush=True)
json.dump(out, open(sys.argv[1], "w"))
