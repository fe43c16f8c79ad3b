"""Run 49 (prepared in session 19): sha256 of fwd+bwd outputs (O, dQ, dK, dV) for the windows that
run49_dq_window_wide.patch and run49_dq_tma.patch touch: D = 128 (descriptors in dQ), D = 192 and 256 (three walks
in dQ instead of one). Compare two trees:  PYTHONPATH=TREE python3 docs/logs/run49_bits_hash.py OUT.json"""
import hashlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jqat

SEG = jnp.repeat(jnp.arange(4, dtype=jnp.int32), 512)[None]
CASES = {
  "window_d128": ((1, 2048, 4, 4, 128), {"is_causal": True, "local_window_size": 300}),
  "window_lens_d128": ((2, 1500, 4, 2, 128), {"is_causal": True, "local_window_size": (200, 0),
                                              "key_value_seq_lengths": jnp.array([1500, 977], jnp.int32)}),
  "window_d192": ((1, 2048, 4, 4, 192), {"is_causal": True, "local_window_size": 300}),
  "window_d256": ((1, 2048, 2, 2, 256), {"is_causal": True, "local_window_size": (511, 0)}),
  "window_segments_d256": ((1, 2048, 2, 2, 256), {"local_window_size": 200, "q_segment_ids": SEG,
                                                  "kv_segment_ids": SEG}),
  "causal_d128": ((1, 2048, 4, 4, 128), {"is_causal": True}),
  "segments_d128": ((1, 2048, 4, 4, 128), {"q_segment_ids": SEG, "kv_segment_ids": SEG}),
}
out = {}
for name, ((b, s, n, kh, d), kw) in CASES.items():
  ks = jax.random.split(jax.random.key(7), 4)
  q, k, v, do = (jax.random.normal(kk, (b, s, h, d), jnp.float32).astype(jnp.bfloat16)
                 for kk, h in zip(ks, (n, kh, kh, n)))
  o, vjp = jax.vjp(lambda q, k, v, kw=kw: jqat.attention(q, k, v, implementation="triton", **kw), q, k, v)
  h = {}
  for nm, x in zip(("O", "dQ", "dK", "dV"), (o, *vjp(do))):
    a = np.asarray(x)
    finite = np.isfinite(a.astype(np.float32)).all()
    h[nm] = hashlib.sha256(a.tobytes()).hexdigest()[:16] + ("" if finite else " nonfinite")
  out[name] = h
  print(name, h, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
