"""Run 48 (session 19): sha256 of fwd+bwd outputs (O, dQ, dK, dV) for fixed inputs, for the cases that
run35_bits_hash.py lacks and this session's forward touches: key lengths without causal at D = 128 (its SASS moved
by one constant's placement), qkv_scale="tensor" at D = 192 and 256 (fq(enc * Q) from the pass). Compare two trees:
  PYTHONPATH=TREE python3 docs/logs/run48_bits_hash.py OUT.json"""
import hashlib, json, sys
import jax, jax.numpy as jnp, numpy as np
import jqat

CASES = {
  "lens_d128": ((2, 1500, 4, 4, 128), {"key_value_seq_lengths": jnp.array([1500, 977], jnp.int32)}),
  "lens_gqa_d128": ((2, 1200, 8, 2, 128), {"query_seq_lengths": jnp.array([1200, 700], jnp.int32),
                                           "key_value_seq_lengths": jnp.array([1111, 1200], jnp.int32)}),
  "tensor_d192": ((1, 1024, 4, 4, 192), {"qkv_scale": "tensor"}),
  "tensor_row_causal_d256": ((1, 1024, 2, 2, 256), {"qkv_scale": "tensor", "p_scale": "row", "is_causal": True}),
  "window_segments_d128": ((1, 2048, 4, 4, 128), {"is_causal": True, "local_window_size": 200,
                                                  "q_segment_ids": jnp.repeat(jnp.arange(4, dtype=jnp.int32), 512)[None],
                                                  "kv_segment_ids": jnp.repeat(jnp.arange(4, dtype=jnp.int32), 512)[None]}),
}
out = {}
for name, ((b, s, n, kh, d), kw) in CASES.items():
  ks = jax.random.split(jax.random.key(7), 4)
  q, k, v, do = (jax.random.normal(kk, (b, s, h, d), jnp.float32).astype(jnp.bfloat16)
                 for kk, h in zip(ks, (n, kh, kh, n)))
  o, vjp = jax.vjp(lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw), q, k, v)
  h = {}
  for nm, x in zip(("O", "dQ", "dK", "dV"), (o, *vjp(do))):
    a = np.asarray(x)
    h[nm] = hashlib.sha256(a.tobytes()).hexdigest()[:16] + ("" if np.isfinite(a.astype(np.float32)).all() else " nonfinite")
  out[name] = h
  print(name, h, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
