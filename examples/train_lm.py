"""Attn-QAT on real text: the paper's ablation with a byte-level Flax (nnx) transformer.

The corpus is the Python standard library's own ``.py`` sources, present on
every machine without a download. Five runs:

  (a) bf16       BF16 attention, trained from scratch (jqat with every switch off)
  (b) fp4-noqat  (a)'s model evaluated with NVFP4 Q, K, V and P in the forward, no training
  (c) attn-qat   (a)'s model trained further with Attn-QAT (jqat defaults)
  (d) no-hp-delta  as (c), delta = rowsum(O * dO) from the quantized O instead of O'
  (e) bf16-p-bwd   as (c), dV = bf16(P)^T dO instead of fq(P)^T dO

Prints a table (validation loss, bits per byte, final and max gradient norm
before clipping) and writes ``results.json`` and ``curves.png`` to ``--out``.

    python examples/train_lm.py              # CPU default, < 15 min on 2 cores
    python examples/train_lm.py --gpu        # long config (auto when JAX's backend is a GPU)
    python examples/train_lm.py --tiny       # seconds; the smoke test
    python examples/train_lm.py --gpu --mesh data=1,seq=2   # attention sequence-parallel (Ulysses) on 2 GPUs

``--mesh data=N,seq=M`` (default: one device) shards each batch over ``data`` and runs
attention through ``jqat.parallel.attention`` (batch over ``data``, Ulysses over ``seq``:
``num_heads`` must be divisible by M); the rest of the model is data-parallel.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import sysconfig
import time

import _plot  # noqa: E402
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jqat.flax  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
  # The CPU default: 8 minutes measured on 2 cores shared with other jobs (the XLA reference attention dominates).
  seq_len: int = 256
  d_model: int = 128
  num_heads: int = 2  # head dim d_model / num_heads = 64
  num_layers: int = 2
  batch_size: int = 8
  steps_pretrain: int = 1000  # run (a)
  steps_qat: int = 300  # runs (c), (d), (e) each
  lr_pretrain: float = 3e-3
  lr_qat: float = 5e-4
  warmup: int = 50
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  eval_every: int = 100
  eval_batches: int = 8
  val_every_files: int = 10  # about one file in 10 goes to validation
  max_files: int | None = None  # None: every file (the tiny config reads fewer)
  implementation: str | None = None  # None: Triton on a GPU, the XLA reference elsewhere
  seed: int = 0


CONFIGS = {
    "cpu": Config(),
    # Sized to a few minutes on one H200 with the Triton kernels (sequence length >= 2048).
    "gpu": Config(seq_len=2048, d_model=256, num_heads=4, num_layers=4, batch_size=8, steps_pretrain=800,
                  steps_qat=250, lr_pretrain=2e-3, lr_qat=3e-4, warmup=50, eval_every=100, eval_batches=8),
    "tiny": Config(seq_len=32, d_model=64, num_heads=1, num_layers=1, batch_size=4, steps_pretrain=6,
                   steps_qat=3, warmup=2, eval_every=3, eval_batches=2, max_files=200),
}

BF16_OFF = dict(quantize_qkv=False, quantize_p=False, high_precision_delta=False, quantize_p_backward=False)
# name -> (description, QAT switches, starting point, train?)
RUNS = {
    "a": ("bf16: BF16 attention from scratch", BF16_OFF, None, True),
    "b": ("fp4-noqat: (a) with NVFP4 forward, no training", {}, "a", False),
    "c": ("attn-qat: (a) + Attn-QAT", {}, "a", True),
    "d": ("no-hp-delta: as (c), delta from O not O'", dict(high_precision_delta=False), "a", True),
    "e": ("bf16-p-bwd: as (c), dV from bf16(P)", dict(quantize_p_backward=False), "a", True),
}


# ----------------------------------------------------------------------------- data


def load_corpus(cfg: Config):
  """Standard-library ``.py`` files, split by a hash of the relative path (stable across machines).

  Returns ``(train bytes [n] uint8, validation bytes [m] uint8, split record)``.
  """
  root = sysconfig.get_paths()["stdlib"]
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
    files += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith(".py")]
  files = sorted(files)[:cfg.max_files]
  is_val = lambda rel: int(hashlib.sha256(rel.encode()).hexdigest(), 16) % cfg.val_every_files == 0
  split = {"train": [f for f in files if not is_val(f)], "val": [f for f in files if is_val(f)]}
  data, record = {}, {"stdlib": root, "python": sys.version.split()[0]}
  for name, rels in split.items():
    chunks = []
    for rel in rels:
      with open(os.path.join(root, rel), "rb") as f:
        chunks.append(f.read())
    data[name] = np.frombuffer(b"\n".join(chunks), np.uint8)
    record[name] = {"files": len(rels), "bytes": int(data[name].size),
                    "file_list_sha256": hashlib.sha256("\n".join(rels).encode()).hexdigest()}
  return data["train"], data["val"], record


def train_batches(data: np.ndarray, cfg: Config, seed: int):
  """Endless random windows ``[batch, seq_len + 1]`` int32 from ``data``; deterministic in ``seed``."""
  rng = np.random.default_rng(seed)
  while True:
    starts = rng.integers(0, data.size - cfg.seq_len - 1, cfg.batch_size)
    yield np.stack([data[s:s + cfg.seq_len + 1] for s in starts]).astype(np.int32)


def val_batches(data: np.ndarray, cfg: Config) -> np.ndarray:
  """Fixed evenly spaced validation windows ``[eval_batches, batch, seq_len + 1]`` int32."""
  n = cfg.eval_batches * cfg.batch_size
  starts = np.linspace(0, data.size - cfg.seq_len - 1, n).astype(np.int64)
  windows = np.stack([data[s:s + cfg.seq_len + 1] for s in starts]).astype(np.int32)
  return windows.reshape(cfg.eval_batches, cfg.batch_size, cfg.seq_len + 1)


# ----------------------------------------------------------------------------- model


class Block(nnx.Module):
  """Pre-norm transformer block; attention in bf16 (the kernels' input dtype), the rest in fp32."""

  def __init__(self, cfg: Config, attention_fn, rngs: nnx.Rngs):
    d = cfg.d_model
    self.norm1 = nnx.LayerNorm(d, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=cfg.num_heads, in_features=d, dtype=jnp.bfloat16,
                                       attention_fn=attention_fn, decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(d, rngs=rngs)
    self.up = nnx.Linear(d, 4 * d, rngs=rngs)
    self.down = nnx.Linear(4 * d, d, rngs=rngs)

  def __call__(self, x):  # x: [B, T, d_model] fp32
    x = x + self.attn(self.norm1(x)).astype(x.dtype)
    return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class ByteLM(nnx.Module):
  """Decoder-only byte-level transformer: tokens [B, T] int32 -> logits [B, T, 256] fp32."""

  def __init__(self, cfg: Config, attention_fn, rngs: nnx.Rngs):
    self.embed = nnx.Embed(256, cfg.d_model, rngs=rngs)
    self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (cfg.seq_len, cfg.d_model)))
    self.blocks = nnx.List([Block(cfg, attention_fn, rngs) for _ in range(cfg.num_layers)])
    self.norm = nnx.LayerNorm(cfg.d_model, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.pos[...][: tokens.shape[1]]
    for block in self.blocks:
      x = block(x)
    return self.embed.attend(self.norm(x))  # tied input/output embedding


def parse_mesh(text: str) -> dict:
  """``"data=N,seq=M"`` -> ``{"data": N, "seq": M}`` (either may be left out: size 1)."""
  sizes = {"data": 1, "seq": 1}
  for part in filter(None, text.split(",")):
    name, _, value = part.partition("=")
    if name not in sizes or not value.isdigit() or int(value) < 1:
      raise ValueError(f"--mesh must look like data=N,seq=M with positive sizes, got {text!r}")
    sizes[name] = int(value)
  return sizes


def make_mesh(sizes: dict):
  n = sizes["data"] * sizes["seq"]
  if n > jax.device_count():
    raise ValueError(f"--mesh data={sizes['data']},seq={sizes['seq']} needs {n} devices, JAX sees {jax.device_count()}")
  return jax.make_mesh((sizes["data"], sizes["seq"]), ("data", "seq"), devices=jax.devices()[:n],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def sharded_attention_fn(mesh, cfg: Config, switches: dict):
  """An nnx ``attention_fn``: causal jqat attention, batch over ``data`` and Ulysses over ``seq``."""
  def attention_fn(query, key, value, mask=None, **_):  # [B, T, N, D]; flax's dropout/dtype keywords unused
    del mask  # the model always passes none: causal
    return jqat.parallel.attention(query, key, value, mesh=mesh, batch_axis="data", seq_axis="seq", is_causal=True,
                                   implementation=cfg.implementation, **switches)
  return attention_fn


def make_model(cfg: Config, switches: dict, state=None, mesh=None) -> ByteLM:
  """A model whose attention runs jqat with ``switches``; weights from ``state`` when given."""
  if mesh is None:
    attention_fn = jqat.flax.make_attention_fn(is_causal=True, implementation=cfg.implementation, **switches)
  else:
    attention_fn = sharded_attention_fn(mesh, cfg, switches)
  model = ByteLM(cfg, attention_fn, nnx.Rngs(cfg.seed))
  if state is not None:
    nnx.update(model, state)
  return model


def loss_fn(model: ByteLM, batch):
  """Mean next-byte cross-entropy in nats; batch: [B, T + 1] int32."""
  logits = model(batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


@nnx.jit
def train_step(model, optimizer, batch):
  loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
  grad_norm = optax.tree.norm(grads)  # before clipping: the clip is part of the optimizer chain
  optimizer.update(model, grads)
  return loss, grad_norm


@nnx.jit
def eval_loss(model, batches):
  """Mean loss over ``batches`` [n, B, T + 1]."""
  return jnp.mean(jax.lax.map(lambda b: loss_fn(model, b), batches))


# ----------------------------------------------------------------------------- loop


class Progress:
  """A one-line text progress bar on stderr, redrawn ~5 times a second (every 10 s into a log file)."""

  def __init__(self, total: int, label: str, width: int = 30):
    self.total, self.label, self.width = total, label, width
    self.start = self.last = time.perf_counter()
    self.interval = 0.2 if sys.stderr.isatty() else 10.0

  def update(self, done: int, note: str = ""):
    now = time.perf_counter()
    if done < self.total and now - self.last < self.interval:
      return
    self.last = now
    fill = int(self.width * done / max(self.total, 1))
    rate = done / max(now - self.start, 1e-9)
    eta = (self.total - done) / rate if rate > 0 else 0.0
    sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (self.width - fill)}] {done}/{self.total} "
                     f"{rate:.1f} it/s eta {eta:.0f}s {note}  ")
    if done >= self.total:
      sys.stderr.write("\n")
    sys.stderr.flush()


def train(model, cfg: Config, data, val, *, steps: int, lr: float, seed: int, label: str, place=jnp.asarray):
  """adamw + global-norm clipping, warmup then cosine decay. Returns the run's curves.

  place: puts a host batch on the device(s) (sharded over ``data`` with ``--mesh``).
  """
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, min(cfg.warmup, steps), max(steps, 1), lr * 0.1)
  tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optax.adamw(schedule, weight_decay=cfg.weight_decay))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  # Validation at step 0 too: for (c)-(e) it is where QAT starts, the FP4 forward of (a)'s model.
  curves = {"step": [], "loss": [], "grad_norm": [], "val_step": [0], "val_loss": [float(eval_loss(model, val))]}
  batches = train_batches(data, cfg, seed)
  bar = Progress(steps, label)
  for step in range(1, steps + 1):
    loss, grad_norm = train_step(model, optimizer, place(next(batches)))
    curves["step"].append(step)
    curves["loss"].append(float(loss))
    curves["grad_norm"].append(float(grad_norm))
    if step % cfg.eval_every == 0 or step == steps:
      curves["val_step"].append(step)
      curves["val_loss"].append(float(eval_loss(model, val)))
    bar.update(step, f"loss {curves['loss'][-1]:.3f} |g| {curves['grad_norm'][-1]:.2f}")
  return curves


def run_all(cfg: Config, out_dir: str, *, profile: str = "custom", mesh_sizes: dict | None = None) -> dict:
  """Runs (a)-(e), writes ``results.json`` and ``curves.png`` to ``out_dir``, returns the results.

  mesh_sizes: ``{"data": N, "seq": M}`` (``--mesh``), or None for one device.
  """
  t_start = time.perf_counter()
  os.makedirs(out_dir, exist_ok=True)
  train_data, val_data, split = load_corpus(cfg)
  mesh, place = None, jnp.asarray
  if mesh_sizes is not None:
    mesh = make_mesh(mesh_sizes)
    place = lambda batch: jax.device_put(batch, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  val = jnp.asarray(val_batches(val_data, cfg))
  if mesh is not None:  # [eval_batches, B, T + 1]: B over data
    val = jax.device_put(val, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "data")))
  print(f"corpus: {split['train']['files']} train files ({split['train']['bytes']:,} bytes), "
        f"{split['val']['files']} validation files ({split['val']['bytes']:,} bytes) from {split['stdlib']}")
  print(f"backend {jax.default_backend()}, profile {profile}: {cfg}")
  results, models = {}, {}
  for name, (description, switches, parent, trains) in RUNS.items():
    t0 = time.perf_counter()
    model = make_model(cfg, {**BF16_OFF, **switches} if parent is None else switches,
                       None if parent is None else nnx.state(models[parent]), mesh)
    curves = {}
    if trains:
      pretrain = parent is None
      # The three continued runs share one data order, so they differ only in their switches.
      curves = train(model, cfg, train_data, val, steps=cfg.steps_pretrain if pretrain else cfg.steps_qat,
                     lr=cfg.lr_pretrain if pretrain else cfg.lr_qat, seed=cfg.seed + (0 if pretrain else 1),
                     label=f"({name})", place=place)
    val_loss = curves["val_loss"][-1] if trains else float(eval_loss(model, val))
    norms = curves.get("grad_norm", [])
    results[name] = {
        "description": description, "switches": switches, "from": parent, "val_loss": val_loss,
        "bits_per_byte": val_loss / math.log(2), "final_grad_norm": norms[-1] if norms else None,
        "max_grad_norm": max(norms) if norms else None, "seconds": time.perf_counter() - t0, "curves": curves}
    models[name] = model
  table = format_table(results)
  print(table)
  summary = {"profile": profile, "config": dataclasses.asdict(cfg), "backend": jax.default_backend(),
             "split": split, "runs": results, "wall_seconds": time.perf_counter() - t_start}
  if mesh_sizes is not None:
    summary["mesh"] = mesh_sizes
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(summary, f, indent=1)
  plot_curves(results, cfg, os.path.join(out_dir, "curves.png"))
  print(f"wrote {out_dir}/results.json and {out_dir}/curves.png in {summary['wall_seconds']:.0f} s")
  return summary


def format_table(results: dict) -> str:
  fmt = lambda v: "-" if v is None else f"{v:.3f}"
  rows = [f"{'run':<52} {'val loss':>9} {'bits/byte':>9} {'final |g|':>9} {'max |g|':>9}"]
  for name, r in results.items():
    rows.append(f"({name}) {r['description']:<48} {r['val_loss']:>9.4f} {r['bits_per_byte']:>9.4f} "
                f"{fmt(r['final_grad_norm']):>9} {fmt(r['max_grad_norm']):>9}")
  return "\n".join(rows)


def plot_curves(results: dict, cfg: Config, path: str):
  """Train/validation loss and gradient norm against the global step ((c)-(e) continue after (a))."""
  offset = {n: 0 if r["from"] is None else cfg.steps_pretrain for n, r in results.items()}
  color = dict(zip(results, _plot.COLORS))
  trained = [n for n, r in results.items() if r["curves"]]
  loss = [(f"{n} train", np.add(results[n]["curves"]["step"], offset[n]), results[n]["curves"]["loss"], color[n])
          for n in trained]
  val = [(f"{n} val", np.add(r["curves"]["val_step"], offset[n]) if r["curves"] else [cfg.steps_pretrain],
          r["curves"]["val_loss"] if r["curves"] else [r["val_loss"]], color[n]) for n, r in results.items()]
  norm = [(n, np.add(results[n]["curves"]["step"], offset[n]), results[n]["curves"]["grad_norm"], color[n])
          for n in trained]
  _plot.plot(path, [
      dict(title="train loss (nats/byte)", series=loss, x_label="step"),
      dict(title="validation loss (nats/byte)", series=val, x_label="step"),
      dict(title="grad norm before clipping", series=norm, log_y=True, x_label="step"),
  ])


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=os.path.join(".", "out", "train_lm"), help="output directory")
  size = parser.add_mutually_exclusive_group()
  size.add_argument("--gpu", action="store_true", help="the long configuration (default when JAX runs on a GPU)")
  size.add_argument("--cpu", action="store_true", help="the short CPU configuration even on a GPU")
  size.add_argument("--tiny", action="store_true", help="a seconds-long smoke configuration")
  parser.add_argument("--mesh", type=parse_mesh, default=None,
                      help="data=N,seq=M: batch over N devices, attention sequence-parallel (Ulysses) over M")
  args = parser.parse_args(argv)
  profile = ("tiny" if args.tiny else "gpu" if args.gpu else "cpu" if args.cpu
             else "gpu" if jax.default_backend() == "gpu" else "cpu")
  return run_all(CONFIGS[profile], args.out, profile=profile, mesh_sizes=args.mesh)


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
