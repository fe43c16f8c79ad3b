"""sha256 of fwd+bwd outputs (O and dQ, dK, dV) for the cases run35_bits_hash.py lacks: compare two trees.

  python3 docs/logs/run42_bits_hash.py OUT.json [case,case,...]

Run 42 changed which instructions form the forward's row max and the E2M1 rounding; these cases reach the loops
and sign paths that run35's do not: a negative softmax scale (folded into Q), fp16 and fp32 inputs, D = 64 causal,
p_scale="row" and qkv_scale="tensor" without a mask.
"""
import hashlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jqat

CASES = {
  "neg_scale": ((1, 1024, 4, 4, 128), jnp.bfloat16, {"scale": -0.08}),
  "neg_scale_causal": ((1, 1024, 4, 4, 128), jnp.bfloat16, {"scale": -0.08, "is_causal": True}),
  "fp16_causal": ((1, 1024, 4, 4, 128), jnp.float16, {"is_causal": True}),
  "fp32_dense": ((1, 512, 2, 2, 64), jnp.float32, {}),
  "d64_causal": ((2, 1024, 4, 4, 64), jnp.bfloat16, {"is_causal": True}),
  "row_dense": ((1, 2048, 4, 4, 128), jnp.bfloat16, {"p_scale": "row"}),
  "tensor_causal": ((1, 2048, 4, 4, 128), jnp.bfloat16, {"qkv_scale": "tensor", "is_causal": True}),
}


def main():
  only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
  out = {}
  for name in only:
    (b, s, n, kh, d), dtype, kw = CASES[name]
    ks = jax.random.split(jax.random.key(7), 4)
    q, k, v, do = (jax.random.normal(key, (b, s, h, d), jnp.float32).astype(dtype)
                   for key, h in zip(ks, (n, kh, kh, n)))
    o, vjp = jax.vjp(lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw), q, k, v)
    h = {}
    for nm, x in zip(("O", "dQ", "dK", "dV"), (o, *vjp(do))):
      a = np.asarray(x)
      h[nm] = hashlib.sha256(a.tobytes()).hexdigest()[:16] + ("" if np.isfinite(a.astype(np.float32)).all()
                                                              else " nonfinite")
    out[name] = h
    print(name, h, flush=True)
  json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
  main()
