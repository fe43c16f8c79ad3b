"""sha256 of fwd+bwd outputs (O and dQ, dK, dV) for fixed inputs under several keyword sets: compare two trees.

run34_bits_hash.py plus a case of packed documents (300 tokens, not tile-aligned) with causal and query lengths."""
import hashlib, json, sys
import jax, jax.numpy as jnp, numpy as np
import jqat

def inputs(b, s, n, kh, d, seed):
  ks = jax.random.split(jax.random.key(seed), 4)
  mk = lambda k, h: jax.random.normal(k, (b, s, h, d), jnp.float32).astype(jnp.bfloat16)
  return mk(ks[0], n), mk(ks[1], kh), mk(ks[2], kh), mk(ks[3], n)

CASES = {
  "dense": ((1, 2048, 8, 8, 128), {}),
  "causal": ((1, 2048, 8, 8, 128), {"is_causal": True}),
  "gqa_causal": ((1, 2048, 8, 2, 128), {"is_causal": True}),
  "d64": ((2, 1024, 4, 4, 64), {}),
  "d80_ragged": ((1, 1000, 4, 4, 80), {"is_causal": True}),
  "d256": ((1, 512, 2, 2, 256), {}),
  "window_lens": ((2, 1500, 4, 4, 128), {"is_causal": True, "local_window_size": 300,
                                         "key_value_seq_lengths": jnp.array([1500, 977], jnp.int32)}),
  "segments_causal_lens": ((2, 2000, 4, 4, 128), {"is_causal": True, "query_seq_lengths": jnp.array([2000, 1500], jnp.int32), "q_segment_ids": jnp.tile((jnp.arange(2000, dtype=jnp.int32) // 300)[None], (2, 1)), "kv_segment_ids": jnp.tile((jnp.arange(2000, dtype=jnp.int32) // 300)[None], (2, 1))}),
  "segments": ((1, 2048, 4, 4, 128), {"q_segment_ids": jnp.repeat(jnp.arange(8, dtype=jnp.int32), 256)[None],
                                      "kv_segment_ids": jnp.repeat(jnp.arange(8, dtype=jnp.int32), 256)[None]}),
  "row": ((1, 2048, 4, 4, 128), {"is_causal": True, "p_scale": "row"}),
  "tensor": ((1, 2048, 4, 4, 128), {"qkv_scale": "tensor"}),
}
only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
out = {}
for name, ((b, s, n, kh, d), kw) in CASES.items():
  if name not in only:
    continue
  q, k, v, do = inputs(b, s, n, kh, d, 7)
  f = lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw)
  o, vjp = jax.vjp(f, q, k, v)
  grads = vjp(do)
  h = {}
  for nm, x in zip(("O", "dQ", "dK", "dV"), (o, *grads)):
    a = np.asarray(x)
    h[nm] = hashlib.sha256(a.tobytes()).hexdigest()[:16] + ("" if np.isfinite(a.astype(np.float32)).all() else " nonfinite")
  out[name] = h
  print(name, h, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
