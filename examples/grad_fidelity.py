"""Gradient fidelity of the ablation's backward variants on real activations (issue 11 item 6).

For a trained checkpoint (examples/train_lm.py's Attn-QAT row), one layer's real post-RoPE q, k, v and its
real dO (the gradient of the LM loss, mean next-byte cross-entropy, with respect to that layer's attention
output, the model running jqat's defaults) at batch 1 and T = 1k, 4k, 16k (validation text). Each variant
runs ``jqat.attention_forward`` / ``attention_backward`` (Triton on a GPU) and its dQ, dK, dV are compared,
as relative Frobenius errors ``||g - g_ref|| / ||g_ref||``, with

  ste    the float64 straight-through gradient of the variant's own quantized forward (:func:`ste_gradients`);
  exact  the float64 gradient of exact attention on the unquantized inputs (context: the total error).

The straight-through reference, all in float64 after the quantizers (causal, top-left):

  Kq = bf16(K - mean_keys(K)) with smooth_k (fp32 mean and difference: jqat's own bits, computed once), else K;
  Qh, Kh, Vh = fq(Q), fq(Kq), fq(V)            (NVFP4, fp32, blocks of 16 along D; exact values)
  S = scale * Qh Kh^T;  m_i = max_j S_ij;  l_i = sum_j exp(S_ij - m_i);  P = exp(S - m) / l   (exact softmax)
  Pt_ij = the forward's quantized probability: with t the KV tile of key j (block_n keys) and m_i^t the
          running max of row i over keys of tiles 0..t,
            block: fq(f32(exp(S_ij - m_i^t)))                 * exp(m_i^t - m_i) / l_i
            row:   fq(f32(R * f32(exp(S_ij - m_i^t)))) / R    * exp(m_i^t - m_i) / l_i,  R = 6 * 448
          (fq along keys, blocks of 16), so that O = Pt Vh is the forward's output in exact arithmetic;
  dV = Pt^T dO          (the exact gradient of O = Pt Vh in Vh; straight through fq(V))
  dP = dO Vh^T;  dS = P * (dP - rowsum(P * dP))   (straight through fq(P): the Jacobian of the exact softmax)
  dQ = scale dS Kh;  dK' = scale dS^T Qh;  dK = dK' - mean_keys(dK') with smooth_k, else dK'
  (straight through fq(Q), fq(K) and the bf16 rounding of SmoothK).

Rows 4, 7 and 8 share the forward, so they share this reference; the backward is what they ablate. Row 1
(every switch off) is compared against ``quantized=False`` (no fq, Pt = P).

    python examples/grad_fidelity.py --checkpoint out/train_lm/attn-qat_seed0.npz --lengths 1024,4096,16384
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import train_lm  # noqa: E402

import jqat
from jqat._src.attention import smooth_keys  # the function jqat.attention_forward(smooth_k=True) runs
from jqat.ffi.options import DEFAULT_BLOCK_N, P_ROW_RANGE

# name -> (forward/backward keywords, QATConfig switches, backward's delta from O instead of O')
VARIANTS = {
    "1 bf16": (dict(), dict(quantize_qkv=False, quantize_p=False, high_precision_delta=False,
                            quantize_p_backward=False), False),
    "4 attn-qat": (dict(), dict(), False),
    "5 +smoothk": (dict(smooth_k=True), dict(), False),
    "6 +two-level-p": (dict(p_scale="row"), dict(), False),
    "7 -hp-o": (dict(), dict(high_precision_delta=False), True),
    "8 -fq-p-bwd": (dict(), dict(quantize_p_backward=False), False),
}


def _fq(x64, axis=-1):
  """NVFP4 fake quantization of float64 values rounded to fp32 (the kernels' working precision), as float64."""
  return jqat.nvfp4.fake_quantize(x64.astype(jnp.float32), axis=axis).astype(jnp.float64)


def ste_gradients(query, key, value, d_out, *, scale=None, is_causal=True, block_n=DEFAULT_BLOCK_N,
                  p_scale="block", smooth_k=False, quantized=True, block_q=256, smoothed_key=None):
  """The float64 straight-through gradient of jqat's quantized forward (module docstring): ``(dQ, dK, dV)``.

  query, d_out: [B, Tq, N, D]; key, value: [B, Tk, K, D] (any float dtype; N % K == 0). Returns float64
  arrays of those shapes; call it inside ``with jax.enable_x64(True):``. Walks query blocks of ``block_q``
  rows, so the largest float64 temporaries are [B, N, block_q, Tk]; ``block_n`` is the forward's KV tile
  (it sets m_i^t). smoothed_key (with smooth_k): the SmoothK key to quantize, as jqat computed it
  (``smooth_keys(key)``, run as jqat runs it); default: ``smooth_keys(key)`` run here. Pass jqat's own when
  comparing with jqat: in another XLA program the FP32 mean may round differently in its last place, and one bf16
  ulp of a smoothed key flips NVFP4 codes (on the H200 that alone put variant 5 at 0.03-0.06 from this reference).
  """
  if not jax.config.jax_enable_x64:
    raise RuntimeError("ste_gradients needs float64: call it inside `with jax.enable_x64(True):`")
  if p_scale not in ("block", "row"):
    raise ValueError(f"p_scale must be 'block' or 'row', got {p_scale!r}")
  b, tq, n, d = query.shape
  kh = key.shape[2]
  if key.shape != value.shape or d_out.shape != query.shape or key.shape[0] != b or key.shape[3] != d or n % kh:
    raise ValueError(f"shapes must be query/d_out [B, Tq, N, D], key/value [B, Tk, K, D] with N % K == 0, got "
                     f"query {query.shape}, key {key.shape}, value {value.shape}, d_out {d_out.shape}")
  if block_n % 16 or block_q < 1:
    raise ValueError(f"block_n must be a multiple of 16 and block_q positive, got {block_n}, {block_q}")
  scale = d**-0.5 if scale is None else scale
  if smoothed_key is not None and not smooth_k:
    raise ValueError("smoothed_key is SmoothK's key: pass it with smooth_k=True (without smooth_k the reference "
                     "quantizes key itself)")
  if smooth_k:
    if smoothed_key is None:
      smoothed_key = smooth_keys(key)
    elif smoothed_key.shape != key.shape or smoothed_key.dtype != key.dtype:
      raise ValueError(f"smoothed_key must match key's shape and dtype, got {smoothed_key.shape} "
                       f"{smoothed_key.dtype} for {key.shape} {key.dtype}")
    key = smoothed_key
  return _ste(query, key, value, d_out, scale=float(scale), is_causal=bool(is_causal), block_n=block_n,
              p_scale=p_scale, smooth_k=bool(smooth_k), quantized=bool(quantized), block_q=min(block_q, tq))


@functools.partial(jax.jit,
                   static_argnames=("scale", "is_causal", "block_n", "p_scale", "smooth_k", "quantized", "block_q"))
def _ste(query, key, value, d_out, *, scale, is_causal, block_n, p_scale, smooth_k, quantized, block_q):
  """``ste_gradients``'s body; with smooth_k, ``key`` is already SmoothK's key (only dK's projection is left)."""
  b, tq, n, d = query.shape
  tk, kh = key.shape[1], key.shape[2]
  prep = (lambda x: _fq(x.astype(jnp.float64))) if quantized else (lambda x: x.astype(jnp.float64))
  qh, khat, vh = prep(query), prep(key), prep(value)
  # [B, N, T, D], KV heads repeated per query head; keys padded to whole KV tiles, queries to whole blocks.
  kr = jnp.repeat(khat, n // kh, axis=2).transpose(0, 2, 1, 3)
  vr = jnp.repeat(vh, n // kh, axis=2).transpose(0, 2, 1, 3)
  tk_pad, tq_pad = -(-tk // block_n) * block_n, -(-tq // block_q) * block_q
  kr = jnp.pad(kr, ((0, 0), (0, 0), (0, tk_pad - tk), (0, 0)))
  vr = jnp.pad(vr, ((0, 0), (0, 0), (0, tk_pad - tk), (0, 0)))
  qr = jnp.pad(qh.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, tq_pad - tq), (0, 0)))
  # Padded query rows get dO = 0: they add nothing to dK, dV.
  dor = jnp.pad(d_out.astype(jnp.float64).transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, tq_pad - tq), (0, 0)))
  cols = jnp.arange(tk_pad)

  def one_block(carry, start):
    dk_acc, dv_acc = carry
    q_blk = jax.lax.dynamic_slice_in_dim(qr, start, block_q, axis=2)  # [B, N, bq, D]
    do_blk = jax.lax.dynamic_slice_in_dim(dor, start, block_q, axis=2)
    rows = start + jnp.arange(block_q)
    visible = cols[None, :] < tk
    if is_causal:
      visible = visible & (cols[None, :] <= rows[:, None])
    s = jnp.where(visible, scale * jnp.einsum("bnqd,bnkd->bnqk", q_blk, kr), -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # a padded row past Tk with no key: everything below is 0
    e = jnp.exp(s - m)
    l = jnp.sum(e, axis=-1, keepdims=True)
    p = e / jnp.where(l > 0, l, 1.0)
    if quantized:
      tiles = s.reshape(s.shape[:-1] + (tk_pad // block_n, block_n))
      m_t = jax.lax.cummax(jnp.max(tiles, axis=-1), axis=tiles.ndim - 2)[..., None]  # running max incl. tile
      m_t = jnp.where(jnp.isfinite(m_t), m_t, 0.0)
      x32 = jnp.exp(tiles - m_t).astype(jnp.float32).reshape(s.shape)
      if p_scale == "row":
        r = jnp.float32(P_ROW_RANGE)
        fx = jqat.nvfp4.fake_quantize(x32 * r, axis=-1).astype(jnp.float64) / float(P_ROW_RANGE)
      else:
        fx = jqat.nvfp4.fake_quantize(x32, axis=-1).astype(jnp.float64)
      rescale = jnp.broadcast_to(jnp.exp(m_t - m[..., None]), tiles.shape).reshape(s.shape)
      pt = fx * rescale / jnp.where(l > 0, l, 1.0)
    else:
      pt = p
    dp = jnp.einsum("bnqd,bnkd->bnqk", do_blk, vr)
    ds = p * (dp - jnp.sum(p * dp, axis=-1, keepdims=True))
    dq_blk = scale * jnp.einsum("bnqk,bnkd->bnqd", ds, kr)
    dk_acc = dk_acc + scale * jnp.einsum("bnqk,bnqd->bnkd", ds, q_blk)
    dv_acc = dv_acc + jnp.einsum("bnqk,bnqd->bnkd", pt, do_blk)
    return (dk_acc, dv_acc), dq_blk

  zeros = jnp.zeros((b, n, tk_pad, d), jnp.float64)
  (dk, dv), dq = jax.lax.scan(one_block, (zeros, zeros), jnp.arange(0, tq_pad, block_q))
  dq = jnp.moveaxis(dq, 0, 2).reshape(b, n, tq_pad, d)[:, :, :tq].transpose(0, 2, 1, 3)
  fold = lambda x: x[:, :, :tk].transpose(0, 2, 1, 3).reshape(b, tk, kh, n // kh, d).sum(axis=3)
  dk, dv = fold(dk), fold(dv)
  if smooth_k:
    dk = dk - jnp.mean(dk, axis=1, keepdims=True)
  return dq, dk, dv


def capture_layer(model_path: str, tokens, layer: int, implementation=None):
  """Post-RoPE ``(q, k, v)`` [1, T, N, D] bf16 of ``layer`` and ``dO``, the gradient of the LM loss on ``tokens``
  [1, T + 1] with respect to that layer's attention output, the model running jqat's defaults."""
  record = {}

  def attention_fn(query, key, value, mask=None, **_):
    del mask  # causal, as in training
    index = record["calls"]
    record["calls"] += 1
    q, k = train_lm.rope(query, cfg.rope_base), train_lm.rope(key, cfg.rope_base)
    out = jqat.attention(q, k, value, is_causal=True, implementation=cfg.implementation)
    if index == layer:
      record["qkv"] = (q, k, value)
      out = out + record["probe"]  # zeros: its gradient is dL/dO of this layer
    return out

  model, cfg = train_lm.load_checkpoint(model_path, {}, attention_fn=attention_fn, implementation=implementation)
  if not 0 <= layer < cfg.num_layers:
    raise ValueError(f"--layer must be in [0, {cfg.num_layers}), got {layer}")

  def loss(probe):
    record.update(calls=0, probe=probe)
    return train_lm.loss_fn(model, tokens), record["qkv"]

  n, dh = cfg.num_heads, cfg.d_model // cfg.num_heads
  probe = jnp.zeros((1, tokens.shape[1] - 1, n, dh), jnp.bfloat16)
  d_out, (q, k, v) = jax.grad(loss, has_aux=True)(probe)
  return q, k, v, d_out, cfg


def rel_err(got, want) -> float:
  """||got - want||_F / ||want||_F in float64."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def variant_gradients(name: str, q, k, v, d_out, implementation=None):
  """(dQ, dK, dV) of a :data:`VARIANTS` entry through jqat's explicit forward and backward."""
  kw, switches, delta_from_o = VARIANTS[name]
  config = jqat.QATConfig(**switches)
  fwd = jqat.attention_forward(q, k, v, is_causal=True, implementation=implementation, config=config, **kw)
  o, o_hp, lse = fwd[:3]
  extra = dict(row_max=fwd[3]) if kw.get("p_scale") == "row" else {}
  return jqat.attention_backward(d_out, q, k, v, o if delta_from_o else o_hp, lse, is_causal=True,
                                 implementation=implementation, config=config, **kw, **extra)


def fidelity(model_path: str, lengths: list[int], *, layer: int, implementation=None, block_q=256) -> list[dict]:
  """One row per (T, variant): the errors of dQ, dK, dV against ``ste`` and ``exact`` (module docstring)."""
  cfg0 = train_lm.load_checkpoint(model_path, {})[1]
  _, val_data, _ = train_lm.load_corpus(cfg0)
  rows = []
  for t in lengths:
    if val_data.size < t + 1:
      raise ValueError(f"T = {t} needs {t + 1} validation bytes, the corpus has {val_data.size}")
    start = (val_data.size - t - 1) // 2  # the middle of the validation text
    tokens = jnp.asarray(val_data[start:start + t + 1][None].astype(np.int32))
    q, k, v, d_out, cfg = capture_layer(model_path, tokens, layer, implementation)
    t0 = time.perf_counter()
    refs = {}
    # SmoothK's key as jqat.attention_forward(smooth_k=True) forms it (eagerly, x64 off): the reference quantizes
    # these very bits (ste_gradients, smoothed_key).
    k_smooth = smooth_keys(k)
    with jax.enable_x64(True):  # the reference alone: the model and jqat run as in training
      for key, kw in {"exact": dict(quantized=False), "block": {},
                      "smooth_k": dict(smooth_k=True, smoothed_key=k_smooth), "row": dict(p_scale="row")}.items():
        refs[key] = jax.device_get(ste_gradients(q, k, v, d_out, block_q=block_q, **kw))
    ref_s = time.perf_counter() - t0
    for name, (kw, switches, _) in VARIANTS.items():
      grads = jax.device_get(variant_gradients(name, q, k, v, d_out, cfg.implementation))
      ste = refs["exact" if switches.get("quantize_qkv") is False else "smooth_k" if kw.get("smooth_k")
                 else kw.get("p_scale", "block")]
      row = {"T": t, "variant": name, "layer": layer}
      for i, g in enumerate("dq dk dv".split()):
        row[f"{g}_ste"] = rel_err(grads[i], ste[i])
        row[f"{g}_exact"] = rel_err(grads[i], refs["exact"][i])
      rows.append(row)
    print(f"T = {t}: float64 references in {ref_s:.1f} s")
  return rows


def format_rows(rows: list[dict]) -> str:
  head = f"{'T':>6} {'variant':<16} " + " ".join(f"{g + ' vs ' + r:>11}" for r in ("ste", "exact")
                                                   for g in ("dQ", "dK", "dV"))
  lines = [head]
  for r in rows:
    lines.append(f"{r['T']:>6} {r['variant']:<16} " + " ".join(f"{r[f'{g}_{ref}']:>11.4f}"
                                                              for ref in ("ste", "exact") for g in ("dq", "dk", "dv")))
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--checkpoint", required=True, help="an .npz from examples/train_lm.py (attn-qat_seed<S>.npz)")
  parser.add_argument("--lengths", default="1024,4096,16384", help="comma-separated sequence lengths (batch 1)")
  parser.add_argument("--layer", type=int, default=0, help="which layer's attention (0: the first)")
  parser.add_argument("--implementation", default=None, help="jqat implementation (default: Triton on a GPU)")
  parser.add_argument("--block-q", type=int, default=256, help="query rows per block of the float64 reference")
  parser.add_argument("--out", default=os.path.join(".", "out", "grad_fidelity.json"), help="JSON output")
  args = parser.parse_args(argv)
  try:
    lengths = [int(x) for x in args.lengths.split(",")]
  except ValueError:
    raise ValueError(f"--lengths must be comma-separated integers, got {args.lengths!r}") from None
  rows = fidelity(args.checkpoint, lengths, layer=args.layer, implementation=args.implementation,
                  block_q=args.block_q)
  print(format_rows(rows))
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump({"checkpoint": args.checkpoint, "backend": jax.default_backend(), "rows": rows}, f, indent=1)
  print(f"wrote {args.out}")
  return rows


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
