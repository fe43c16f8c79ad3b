"""Huge logits: the row max's probability is exactly 1, so rows stay one-hot instead of empty or infinite.

Before (issue 43): the XLA reference at scale >= 1e8 and the compiled kernels from scale 1e7 with unquantized Q/K
gave rows of zeros, lse of +-inf and NaN: s was rounded one way for the row max m and another (an FMA of the
product with -m) in exp(s - m), so the max's p was exp(rounding error of s) -- 0 or +Inf once |s| is large.
At such scales the softmax is one-hot wherever one score clearly leads: O = fq(1) * V_hat[argmax] (fq(1) = 1.03125),
O' = V_hat[argmax] and lse = the max score, bit for bit (O, O') or to FP32 rounding (lse). Implementations: the XLA
reference, the Triton kernels compiled on a GPU (through the JAX API) and, on a CPU machine, in Triton's interpreter
(which never contracts a multiply-add, so there the check guards the kernels' one-rounding form rather than
reproducing the bug).
"""

import os

from conftest import HAS_GPU  # noqa: E402

os.environ.setdefault("TRITON_INTERPRET", "0" if HAS_GPU else "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from oracle import fq_oracle  # noqa: E402

import jqat  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
IMPLEMENTATIONS = ["xla", pytest.param("triton", marks=pytest.mark.gpu),
                   pytest.param("interpreter", marks=pytest.mark.skipif(not INTERPRET, reason="CPU interpreter"))]
SCALES = [1e7, 1e10, 1e30]  # from where the kernels failed (1e7), past where XLA did (1e8), to FP32's edge
# (B, Tq, Tk, N, K, D): one KV tile (XLA then unrolls the walk and fuses s into both of its consumers: the case
# that failed), and three tiles of 64, the last partial, GQA.
SHAPES = [(1, 64, 64, 2, 2, 32), (1, 48, 150, 2, 1, 32)]



def _inputs(shape, seed=0):
  b, tq, tk, n, kh, d = shape
  ks = jax.random.split(jax.random.key(seed), 4)
  mk = lambda key, t, h: jax.random.normal(key, (b, t, h, d), jnp.float32).astype(jnp.bfloat16)
  return mk(ks[0], tq, n), mk(ks[1], tk, kh), mk(ks[2], tk, kh), mk(ks[3], tq, n)


def _forward(implementation, q, k, v, scale, is_causal, quantize_qkv):
  cfg = jqat.QATConfig(quantize_qkv=quantize_qkv)
  if implementation != "interpreter":
    return jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, scale=scale, is_causal=is_causal, config=cfg,
                                                          implementation=implementation))(q, k, v)
  import torch

  from jqat._src import validate
  from jqat.torch import _attention as ta

  to_bhsd = lambda x: torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).transpose(1, 2).contiguous()
  qt, kt, vt = map(to_bhsd, (q, k, v))
  opts = validate.attention_options(scale=scale, is_causal=is_causal, block_n=jqat.DEFAULT_BLOCK_N,
                                    head_dim=q.shape[-1], config=cfg)
  o, o_hp = torch.empty_like(qt), torch.empty_like(qt)
  lse = torch.empty(qt.shape[:3], dtype=torch.float32)
  ta.forward_kernels(qt, kt, vt, o, o_hp, lse, opts)
  return o.float().transpose(1, 2).numpy(), o_hp.float().transpose(1, 2).numpy(), lse.numpy()


def _one_hot_rows(q, k, v, scale, is_causal, quantize_qkv):
  """Float64 scores of the quantized (or not) inputs: for each (row, head) whose max leads the runner-up by at
  least 1e-3 of its size (the FP32 scores cannot reorder them, and exp of the gap is 0), its argmax; -1 elsewhere.
  Also V_hat and the max scores."""
  q, k, v = (np.asarray(x, np.float32) for x in (q, k, v))
  if quantize_qkv:
    q, k, v = (fq_oracle(x) for x in (q, k, v))
  g = q.shape[2] // k.shape[2]
  kr = np.repeat(k, g, axis=2).astype(np.float64)
  s = scale * np.einsum("bqnd,bknd->bnqk", q.astype(np.float64), kr)
  if is_causal:
    s = np.where(np.arange(s.shape[-1])[None, :] <= np.arange(s.shape[-2])[:, None], s, -np.inf)
  top2 = np.sort(s, axis=-1)[..., -2:]
  clear = (top2[..., 1] - top2[..., 0]) >= 1e-3 * np.abs(top2[..., 1])
  return np.where(clear, np.argmax(s, axis=-1), -1), np.repeat(v, g, axis=2), top2[..., 1]


def _bf16(x):
  return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32))


def _row_max_params():
  """Every case on XLA and the GPU; the interpreter (which never contracts, so it passed before the fix too) on the
  three-tile causal case alone."""
  for impl in IMPLEMENTATIONS:
    name, marks = (impl, ()) if isinstance(impl, str) else (impl.values[0], impl.marks)
    for shape, shape_id in zip(SHAPES, ("one_tile", "three_tiles")):
      for quantize_qkv in (False, True):
        for is_causal in (False, True):
          for scale in SCALES:
            if name != "interpreter" or (shape_id == "three_tiles" and is_causal):
              yield pytest.param(name, scale, is_causal, quantize_qkv, shape, marks=marks,
                                 id=f"{scale:g}-{is_causal}-{quantize_qkv}-{shape_id}-{name}")


@pytest.mark.parametrize("implementation, scale, is_causal, quantize_qkv, shape", list(_row_max_params()))
def test_huge_logits_keep_the_row_max(implementation, scale, is_causal, quantize_qkv, shape):
  q, k, v, _ = _inputs(shape)
  o, o_hp, lse = (np.asarray(x, np.float32) for x in _forward(implementation, q, k, v, scale, is_causal,
                                                              quantize_qkv))
  assert not np.isnan(o).any() and not np.isnan(o_hp).any(), "NaN from finite inputs"
  assert np.isfinite(lse).all(), f"{int((~np.isfinite(lse)).sum())} rows with a non-finite lse"
  arg, v_hat, s_max = _one_hot_rows(q, k, v, scale, is_causal, quantize_qkv)
  b, n, tq = arg.shape
  checked = 0
  for bi in range(b):
    for h in range(n):
      for i in range(tq):
        j = arg[bi, h, i]
        if j < 0:
          continue
        checked += 1
        row = v_hat[bi, j, h]
        np.testing.assert_array_equal(o_hp[bi, i, h], _bf16(row), err_msg=f"O' row {i} head {h}")
        want = _bf16(1.03125 * row)  # fq(1) = 6 * e4m3(1 / 6) = 1.03125 (docs/NUMERICS.md, section 2)
        np.testing.assert_array_equal(o[bi, i, h], want, err_msg=f"O row {i} head {h}")
        assert abs(lse[bi, h, i] - s_max[bi, h, i]) <= 1e-6 * abs(s_max[bi, h, i]), (i, h, lse[bi, h, i])
  assert checked >= b * n * tq // 2, f"only {checked} clearly one-hot rows: the case tests little"


@pytest.mark.parametrize("shape", SHAPES, ids=("one_tile", "three_tiles"))
@pytest.mark.parametrize("quantize_qkv", [False])  # unquantized Q, K: the largest scores
@pytest.mark.parametrize("scale", SCALES)
def test_huge_logits_give_finite_xla_gradients(scale, quantize_qkv, shape):
  """The XLA backward's P = exp(s - lse) had the same fault (NaN dQ and dK from scale 1e10): P <= 1 now, exactly 1
  where s reaches lse. (The kernels' backward goes through the natural-log lse and base 2, which at such magnitudes
  is an ulp of s away: see docs/RELIABILITY.md.)"""
  q, k, v, do = _inputs(shape, seed=1)
  cfg = jqat.QATConfig(quantize_qkv=quantize_qkv)
  o, o_hp, lse = jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, scale=scale, config=cfg,
                                                                implementation="xla"))(q, k, v)
  grads = jax.jit(lambda *a: jqat.attention_backward(*a, scale=scale, config=cfg, implementation="xla"))(
      do, q, k, v, o_hp, lse)
  for name, g in zip(("dQ", "dK", "dV"), grads):
    g = np.asarray(g, np.float32)
    assert np.isfinite(g).all(), f"{name}: {int((~np.isfinite(g)).sum())} non-finite elements"
