"""Serving the demo's Attn-QAT model (examples/train_lm.py) through jqat's packed NVFP4 KV cache.

Every layer keeps its K and V in a ``jqat.flax.PackedKVCache`` (0.5625 bytes a value) and attends with
``jqat.decode_attention``; the comparison keeps them in BF16 and attends with ``jax.nn.dot_product_attention``
(plain BF16 attention, what a server without jqat runs). Two checks, both written to the results:

- the loss: validation windows fed through the cache in chunks of 64 tokens (``num_splits=1``: each query walks
  the keys' tiles as the training forward does) give the training forward's validation loss to within 1e-3 nats;
- greedy generation: the same prompts continued with the packed cache and with the BF16 cache, their tokens per
  second and how many of the generated tokens agree.

    python examples/train_lm.py --tiny            # trains, then serves the Attn-QAT checkpoint (--generate 0: no)
    python examples/serve_lm.py out/train_lm/attn-qat_seed0.npz --tokens 256
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jqat
import jqat.flax

CHUNK = 64  # new tokens per decode call: one KV tile (block_n), the most decode_attention takes


class Bf16KVCache(nnx.Module):
  """The comparison: K and V in BF16 ``[B, T, K, D]``, plain BF16 attention over the filled part."""

  def __init__(self, batch: int, capacity: int, kv_heads: int, head_dim: int):
    self.k = nnx.Cache(jnp.zeros((batch, capacity, kv_heads, head_dim), jnp.bfloat16))
    self.v = nnx.Cache(jnp.zeros((batch, capacity, kv_heads, head_dim), jnp.bfloat16))
    self.lengths = nnx.Cache(jnp.zeros((batch,), jnp.int32))

  def decode(self, query, key, value, **_):
    tn, start = key.shape[1], self.lengths[...][0]  # the demo's sequences advance together
    self.k[...] = jax.lax.dynamic_update_slice_in_dim(self.k[...], key.astype(jnp.bfloat16), start, axis=1)
    self.v[...] = jax.lax.dynamic_update_slice_in_dim(self.v[...], value.astype(jnp.bfloat16), start, axis=1)
    self.lengths[...] = self.lengths[...] + tn
    keys = jnp.arange(self.k.shape[1])[None, :]
    visible = keys <= start + jnp.arange(tn)[:, None]  # causal among the new tokens, nothing past them
    return jax.nn.dot_product_attention(query, self.k[...], self.v[...], mask=visible[None, None])


class Server(nnx.Module):
  """A trained ``train_lm.ByteLM`` with one KV cache per layer (``kind``: "packed" or "bf16")."""

  def __init__(self, model, cfg, batch: int, capacity: int, kind: str):
    self.model = model
    self.cfg = cfg
    make = jqat.flax.PackedKVCache if kind == "packed" else Bf16KVCache
    d = cfg.d_model // cfg.num_heads
    self.caches = nnx.List([make(batch, capacity, cfg.num_heads, d) for _ in range(cfg.num_layers)])

  def __call__(self, tokens):
    """Logits [B, Tn, 256] of ``tokens [B, Tn]`` (Tn <= 64) continuing every cached sequence."""
    import train_lm  # noqa: PLC0415  (the model's RoPE)

    m = self.model
    x = m.embed(tokens)
    for block, cache in zip(m.blocks, self.caches):
      positions = cache.lengths[...][:, None] + jnp.arange(tokens.shape[1])[None, :]
      h = block.norm1(x)
      a = block.attn
      q, k, v = a.query(h), a.key(h), a.value(h)
      q, k = (train_lm.rope(t, self.cfg.rope_base, positions) for t in (q, k))
      o = cache.decode(q, k, v, num_splits=1, implementation=self.cfg.implementation)
      x = x + a.out(o).astype(x.dtype)
      x = x + block.down(jax.nn.gelu(block.up(block.norm2(x))))
    return m.embed.attend(m.norm(x))


@nnx.jit
def _step(server, tokens):
  return server(tokens)


def cache_loss(model, cfg, windows) -> float:
  """Mean next-byte cross-entropy of ``windows [n, B, T + 1]`` computed through the packed cache, 64 tokens a call."""
  import optax  # noqa: PLC0415

  losses = []
  for batch in np.asarray(windows):
    server = Server(model, cfg, batch.shape[0], batch.shape[1] - 1, "packed")
    inputs = jnp.asarray(batch[:, :-1])
    logits = jnp.concatenate([_step(server, inputs[:, s:s + CHUNK]) for s in range(0, inputs.shape[1], CHUNK)], 1)
    losses.append(optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(batch[:, 1:])).mean())
  return float(jnp.mean(jnp.stack(losses)))


def generate(model, cfg, prompts, tokens: int, kind: str):
  """Greedy continuation of ``prompts [B, P]`` by ``tokens`` bytes; returns (generated [B, tokens], tokens/s of the
  decode steps after the first, which compiles)."""
  b, p = prompts.shape
  server = Server(model, cfg, b, p + tokens, kind)
  logits = None
  for s in range(0, p, CHUNK):
    logits = _step(server, jnp.asarray(prompts[:, s:s + CHUNK]))
  nxt = jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)
  out = [nxt]
  nxt = jnp.argmax(_step(server, nxt)[:, -1], -1)[:, None].astype(jnp.int32)  # compiles the one-token step
  out.append(nxt)
  jax.block_until_ready(nxt)
  t0 = time.perf_counter()
  for _ in range(tokens - 2):
    nxt = jnp.argmax(_step(server, nxt)[:, -1], -1)[:, None].astype(jnp.int32)
    out.append(nxt)
  jax.block_until_ready(nxt)
  rate = b * (tokens - 2) / max(time.perf_counter() - t0, 1e-9)
  return np.asarray(jnp.concatenate(out, 1)), rate


def serve_report(model, cfg, val, *, tokens: int = 256, batches: int = 2, prompt: int = CHUNK) -> dict:
  """The loss check and the greedy comparison on the first ``batches`` validation batches (``val [n, B, T + 1]``)."""
  import train_lm  # noqa: PLC0415

  windows = np.asarray(val)[:batches]
  forward = float(train_lm.eval_loss(model, jnp.asarray(windows)))
  through_cache = cache_loss(model, cfg, windows)
  prompts = windows[0, :, :prompt]
  packed, packed_rate = generate(model, cfg, prompts, tokens, "packed")
  bf16, bf16_rate = generate(model, cfg, prompts, tokens, "bf16")
  difference = abs(through_cache - forward)
  report = {"val_loss_forward": forward, "val_loss_cache": through_cache, "val_loss_difference": difference,
            "loss_check_passed": difference <= 1e-3,
            "tokens": tokens, "batch": int(prompts.shape[0]), "packed_tokens_per_s": packed_rate,
            "bf16_tokens_per_s": bf16_rate, "agreement": float((packed == bf16).mean()),
            "first_divergence": [int(np.argmax(r != s)) if (r != s).any() else tokens for r, s in zip(packed, bf16)],
            "sample_packed": bytes(packed[0].astype(np.uint8)).decode("utf-8", "replace"),
            "sample_bf16": bytes(bf16[0].astype(np.uint8)).decode("utf-8", "replace")}
  print(f"serving: validation loss through the packed cache {through_cache:.5f} vs the training forward {forward:.5f} "
        f"(|diff| {report['val_loss_difference']:.1e}, bound 1e-3: {'ok' if report['loss_check_passed'] else 'FAIL'}); "
        f"greedy {tokens} tokens x {report['batch']}: packed cache {packed_rate:.0f} tokens/s, BF16 cache "
        f"{bf16_rate:.0f} tokens/s, {100 * report['agreement']:.1f}% of tokens agree")
  return report


def main(argv=None):
  import train_lm  # noqa: PLC0415

  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("checkpoint", help="an .npz of examples/train_lm.py (attn-qat_seed<S>.npz)")
  ap.add_argument("--tokens", type=int, default=256)
  ap.add_argument("--out", default=None, help="write the report as JSON here")
  args = ap.parse_args(argv)
  model, cfg = train_lm.load_checkpoint(args.checkpoint, {})
  _, val_data, _ = train_lm.load_corpus(cfg)
  report = serve_report(model, cfg, train_lm.val_batches(val_data, cfg), tokens=args.tokens)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(report, f, indent=1)
  return report


if __name__ == "__main__":
  main()
