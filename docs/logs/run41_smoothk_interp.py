# Run 41 (CPU, interpreter): the Triton plans against the XLA implementation on the tiny checkpoint's real q, k, v, dO,
# with the plain and the SmoothK key. Usage: run41_fidelity_cpu.py first (it writes ckpt.npz), then
# PYTHONPATH=<repo> python3 <repo>/docs/logs/run41_smoothk_interp.py 256
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
R = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [os.path.join(R, "examples"), R, os.path.join(R, "tests")]
import numpy as np, jax, jax.numpy as jnp, torch
import train_lm, grad_fidelity as gf, jqat
from jqat._src.attention import smooth_keys
import test_attention_triton as tat
T = int(sys.argv[1])
cfg0 = train_lm.load_checkpoint("ckpt.npz", {})[1]
_, val, _ = train_lm.load_corpus(cfg0)
start = (val.size - T - 1) // 2
tokens = jnp.asarray(val[start:start + T + 1][None].astype(np.int32))
q, k, v, do, cfg = gf.capture_layer("ckpt.npz", tokens, 0, "xla")
d = q.shape[-1]; scale = d ** -0.5
qc = jqat.QATConfig()
def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64); return np.linalg.norm(a - b) / np.linalg.norm(b)
for name, kk in (("plain", k), ("smoothed", smooth_keys(k))):
    o, ohp, lse = jqat.attention_forward(q, kk, v, is_causal=True, implementation="xla", config=qc)[:3]
    gx = jqat.attention_backward(do, q, kk, v, ohp, lse, is_causal=True, implementation="xla", config=qc)
    t = lambda x: torch.from_numpy(np.asarray(jnp.asarray(x, jnp.float32))).to(torch.bfloat16)
    to, tohp, tlse = tat._kernel_forward(t(q), t(kk), t(v), scale=scale, is_causal=True, block_n=64, block_m=64, cfg=qc)
    gt = tat._kernel_backward(t(do), t(q), t(kk), t(v), tohp, tlse, scale=scale, is_causal=True, blocks=(64, 64, 64, 32), cfg=qc)
    print(name, "O", rel(to.float(), o.astype(jnp.float32)), "lse", rel(tlse, lse),
          "dq", rel(gt[0].float(), gx[0].astype(jnp.float32)), "dk", rel(gt[1].float(), gx[1].astype(jnp.float32)),
          "dv", rel(gt[2].float(), gx[2].astype(jnp.float32)), "kmean/kstd", float(jnp.abs(jnp.mean(k.astype(jnp.float32),1)).mean()/jnp.std(k.astype(jnp.float32))), flush=True)
