"""Attn-QAT on real text: the paper's ablation (Wan 2.1 table, rows 1-8) with a byte-level Flax (nnx) transformer.

The corpus is the Python standard library's own ``.py`` sources, present on
every machine without a download. Per seed, a BF16 model is pretrained from
scratch (RoPE positions, so a checkpoint runs at any length), then:

  row 1  bf16         the pretrained model, BF16 attention (jqat with every switch off)
  row 1c bf16-cont    control: the pretrained model trained on in BF16 for as many steps as each QAT run
  row 2  fp4          the pretrained model evaluated with NVFP4 Q, K, V and P in the forward, no training
  row 3  sage3        as row 2 with SmoothK and two-level P (SageAttention3, training-free), no training
  row 4  attn-qat     the pretrained model trained on with Attn-QAT (jqat's defaults, p_scale="block")
  row 5  +smoothk     as row 4, smooth_k=True
  row 6  +two-level-p as row 4, p_scale="row"
  row 7  -hp-o        as row 4, delta = rowsum(O * dO) from the quantized O instead of O'
  row 8  -fq-p-bwd    as row 4, dV = bf16(P)^T dO instead of fq(P)^T dO

The continued runs of a seed share one data order, so they differ only in their switches; the seed changes
the initialization and both data orders. Each seed writes ``results_seed<S>.json`` and the Attn-QAT row's
weights ``attn-qat_seed<S>.npz`` (for examples/grad_fidelity.py); the seeds of one call, or of several calls
through ``--merge``, give ``results.json`` (mean and spread per row), a table on stdout and ``curves.png``
(matplotlib, the ``demo`` extra; skipped with a note when it is missing).

    python examples/train_lm.py              # CPU default, one seed
    python examples/train_lm.py --gpu --seeds 0,1,2            # long config (auto when JAX's backend is a GPU)
    python examples/train_lm.py --gpu --seeds 1 --out out/s1   # one seed per process ...
    python examples/train_lm.py --merge out/s0 out/s1 out/s2 --out out/all   # ... merged afterwards
    python examples/train_lm.py --tiny       # seconds; the smoke test
    python examples/train_lm.py --gpu --mesh data=1,seq=2   # attention sequence-parallel (Ulysses) on 2 GPUs
    python examples/train_lm.py --gpu --set steps_qat=1000,seq_len=4096   # override Config fields

``--mesh data=N,seq=M`` (default: one device) shards each batch over ``data`` and runs
attention through ``jqat.parallel.attention`` (batch over ``data``, Ulysses over ``seq``:
``num_heads`` must be divisible by M); the rest of the model is data-parallel.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
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
import serve_lm
from flax import nnx

import jqat.flax  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
  # The CPU default: minutes on 2 cores shared with other jobs (the XLA reference attention dominates).
  seq_len: int = 256
  d_model: int = 128
  num_heads: int = 2  # head dim d_model / num_heads = 64
  num_layers: int = 2
  batch_size: int = 8
  steps_pretrain: int = 1000  # the BF16 model every row starts from
  steps_qat: int = 300  # each continued run (rows 1c, 4-8)
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
  rope_base: float = 10000.0
  seed: int = 0
  serve_tokens: int = 256  # greedy tokens generated through the KV caches after training (examples/serve_lm.py)


CONFIGS = {
    "cpu": Config(),
    # Sized to a few minutes per seed on one H200 with the Triton kernels (sequence length >= 2048).
    "gpu": Config(seq_len=2048, d_model=256, num_heads=4, num_layers=4, batch_size=8, steps_pretrain=800,
                  steps_qat=250, lr_pretrain=2e-3, lr_qat=3e-4, warmup=50, eval_every=50, eval_batches=8),
    "tiny": Config(seq_len=32, d_model=64, num_heads=1, num_layers=1, batch_size=4, steps_pretrain=6,
                   steps_qat=3, warmup=2, eval_every=3, eval_batches=2, max_files=200, serve_tokens=16),
}

BF16_OFF = dict(quantize_qkv=False, quantize_p=False, high_precision_delta=False, quantize_p_backward=False)


@dataclasses.dataclass(frozen=True)
class Row:
  """One row of the ablation: jqat switches applied to the pretrained BF16 model, trained on or only evaluated."""
  key: str
  paper_row: str  # the row of the paper's Wan 2.1 1.3B table ("1c": this demo's control)
  description: str
  switches: dict
  trains: bool


ROWS = [
    Row("bf16", "1", "BF16 (pretrained, evaluated)", BF16_OFF, False),
    Row("bf16-cont", "1c", "BF16 continued training (control)", BF16_OFF, True),
    Row("fp4", "2", "FP4 forward, no training", {}, False),
    Row("sage3", "3", "FP4 + SmoothK + two-level P, no training", dict(smooth_k=True, p_scale="row"), False),
    Row("attn-qat", "4", "Attn-QAT", {}, True),
    Row("+smoothk", "5", "Attn-QAT + SmoothK", dict(smooth_k=True), True),
    Row("+two-level-p", "6", "Attn-QAT + two-level P (p_scale row)", dict(p_scale="row"), True),
    Row("-hp-o", "7", "Attn-QAT - high-precision O' in BWD", dict(high_precision_delta=False), True),
    Row("-fq-p-bwd", "8", "Attn-QAT - fake quantization of P in BWD", dict(quantize_p_backward=False), True),
]
CHECKPOINT_ROW = "attn-qat"
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


def rope(x, base: float, positions=None):
  """Rotary position embedding (rotate-half pairing): x [B, T, N, D] -> [B, T, N, D] in x's dtype.

  positions: int [B, T] (decoding through a KV cache), or None for 0..T-1 of the call; the angles are fp32; plain
  jnp so it runs under any sharding.
  """
  t, half = x.shape[-3], x.shape[-1] // 2
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  pos = jnp.arange(t, dtype=jnp.float32)[None] if positions is None else positions.astype(jnp.float32)
  angle = pos[..., None] * inv_freq  # [B or 1, T, D/2]
  cos, sin = jnp.cos(angle)[..., None, :], jnp.sin(angle)[..., None, :]  # [B or 1, T, 1, D/2]: over heads
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def rope_attention_fn(attention, cfg: Config):
  """An nnx ``attention_fn``: RoPE on query and key, then ``attention(q, k, v)`` (causal)."""
  def attention_fn(query, key, value, mask=None, **_):  # [B, T, N, D]; flax's dropout/dtype keywords unused
    del mask  # the model always passes none: causal
    return attention(rope(query, cfg.rope_base), rope(key, cfg.rope_base), value)
  return attention_fn


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
  """Decoder-only byte-level transformer: tokens [B, T] int32 -> logits [B, T, 256] fp32; RoPE, any T."""

  def __init__(self, cfg: Config, attention_fn, rngs: nnx.Rngs):
    self.embed = nnx.Embed(256, cfg.d_model, rngs=rngs)
    self.blocks = nnx.List([Block(cfg, attention_fn, rngs) for _ in range(cfg.num_layers)])
    self.norm = nnx.LayerNorm(cfg.d_model, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
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


def _attention(cfg: Config, switches: dict, mesh):
  """``(q, k, v) -> o``: causal jqat attention with ``switches``; over ``mesh`` (batch over ``data``, Ulysses
  over ``seq``) when given."""
  if mesh is None:
    return lambda q, k, v: jqat.attention(q, k, v, is_causal=True, implementation=cfg.implementation, **switches)
  return lambda q, k, v: jqat.parallel.attention(q, k, v, mesh=mesh, batch_axis="data", seq_axis="seq",
                                                 is_causal=True, implementation=cfg.implementation, **switches)


@functools.cache
def _cached_attention_fn(cfg: Config, switches: tuple, mesh) -> callable:
  # One function object per configuration: models that share it have equal graph definitions, so nnx.jit
  # reuses their compiled train and eval steps (the BF16 control reuses the pretraining's).
  return rope_attention_fn(_attention(cfg, dict(switches), mesh), cfg)


def make_model(cfg: Config, switches: dict, state=None, mesh=None, attention_fn=None) -> ByteLM:
  """A model whose attention runs jqat with ``switches``; weights from ``state`` when given.

  attention_fn: replaces the RoPE + jqat attention entirely (examples/grad_fidelity.py probes a layer with it).
  """
  if attention_fn is None:
    attention_fn = _cached_attention_fn(dataclasses.replace(cfg, seed=0), tuple(sorted(switches.items())), mesh)
  model = ByteLM(cfg, attention_fn, nnx.Rngs(cfg.seed))
  if state is not None:
    nnx.update(model, state)
  return model


def save_checkpoint(path: str, model: ByteLM, cfg: Config):
  """Writes the model's parameters and ``cfg`` (JSON) to an ``.npz`` (no pickle: np.load(allow_pickle=False))."""
  flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
  arrays = {jax.tree_util.keystr(p): np.asarray(jnp.asarray(v, jnp.float32)) for p, v in flat}
  np.savez(path, __config__=np.array(json.dumps(dataclasses.asdict(cfg))), **arrays)


def load_checkpoint(path: str, switches: dict, attention_fn=None, **overrides) -> tuple[ByteLM, Config]:
  """A model from :func:`save_checkpoint`'s file; its attention runs jqat with ``switches``.

  overrides: Config fields to change (e.g. ``implementation``); the architecture comes from the file.
  """
  with np.load(path, allow_pickle=False) as f:
    cfg = dataclasses.replace(Config(**json.loads(str(f["__config__"]))), **overrides)
    model = make_model(cfg, switches, attention_fn=attention_fn)
    state = nnx.state(model, nnx.Param)
    paths, treedef = jax.tree_util.tree_flatten_with_path(state)
    leaves = []
    for p, v in paths:
      name = jax.tree_util.keystr(p)
      if name not in f.files or f[name].shape != v.shape:
        raise ValueError(f"checkpoint {path}: parameter {name} of shape {v.shape} missing or of another shape")
      leaves.append(jnp.asarray(f[name], v.dtype))
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, leaves))
  return model, cfg


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


@functools.cache
def _optimizer(cfg: Config, steps: int, lr: float):
  # Cached for the reason of _cached_attention_fn: the optimizer's transformation is part of its graph definition.
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, min(cfg.warmup, steps), max(steps, 1), lr * 0.1)
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optax.adamw(schedule, weight_decay=cfg.weight_decay))


def train(model, cfg: Config, data, val, *, steps: int, lr: float, seed, label: str, place=jnp.asarray):
  """adamw + global-norm clipping, warmup then cosine decay. Returns the run's curves.

  seed: anything ``np.random.default_rng`` takes (the data order). place: puts a host batch on the device(s)
  (sharded over ``data`` with ``--mesh``). ``curves["step_ms"]``: median wall time of a step after the first
  (which compiles), validation excluded.
  """
  optimizer = nnx.Optimizer(model, _optimizer(dataclasses.replace(cfg, seed=0), steps, lr), wrt=nnx.Param)
  # Validation at step 0 too: for a continued run it is where the run starts (for QAT, the FP4 forward).
  curves = {"step": [], "loss": [], "grad_norm": [], "val_step": [0], "val_loss": [float(eval_loss(model, val))]}
  batches = train_batches(data, cfg, seed)
  bar = Progress(steps, label)
  step_s = []
  for step in range(1, steps + 1):
    t0 = time.perf_counter()
    loss, grad_norm = train_step(model, optimizer, place(next(batches)))
    curves["loss"].append(float(loss))  # float() waits for the step: the timing covers it
    step_s.append(time.perf_counter() - t0)
    curves["step"].append(step)
    curves["grad_norm"].append(float(grad_norm))
    if step % cfg.eval_every == 0 or step == steps:
      curves["val_step"].append(step)
      curves["val_loss"].append(float(eval_loss(model, val)))
    bar.update(step, f"loss {curves['loss'][-1]:.3f} |g| {curves['grad_norm'][-1]:.2f}")
  curves["step_ms"] = 1e3 * float(np.median(step_s[1:] if steps > 1 else step_s))
  return curves


def _setup(cfg: Config, mesh_sizes: dict | None):
  """Corpus, validation batches and the batch placement for ``mesh_sizes`` (None: one device)."""
  train_data, val_data, split = load_corpus(cfg)
  mesh, place = None, jnp.asarray
  val = jnp.asarray(val_batches(val_data, cfg))
  if mesh_sizes is not None:
    mesh = make_mesh(mesh_sizes)
    sharding = lambda *spec: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    place = lambda batch: jax.device_put(batch, sharding("data"))
    val = jax.device_put(val, sharding(None, "data"))  # [eval_batches, B, T + 1]: B over data
  return train_data, val, split, mesh, place


def run_seed(cfg: Config, out_dir: str, *, profile: str = "custom", mesh_sizes: dict | None = None,
             rows: list[Row] = ROWS) -> dict:
  """Pretrains in BF16, then ``rows`` (default: all of :data:`ROWS`) for ``cfg.seed``; writes
  ``results_seed<S>.json`` and the Attn-QAT row's checkpoint to ``out_dir``; returns the seed's results."""
  t_start = time.perf_counter()
  os.makedirs(out_dir, exist_ok=True)
  train_data, val, split, mesh, place = _setup(cfg, mesh_sizes)
  print(f"corpus: {split['train']['files']} train files ({split['train']['bytes']:,} bytes), "
        f"{split['val']['files']} validation files ({split['val']['bytes']:,} bytes) from {split['stdlib']}")
  print(f"backend {jax.default_backend()}, profile {profile}: {cfg}")
  t0 = time.perf_counter()
  pretrained = make_model(cfg, BF16_OFF, mesh=mesh)
  curves = train(pretrained, cfg, train_data, val, steps=cfg.steps_pretrain, lr=cfg.lr_pretrain,
                 seed=(cfg.seed, 0), label=f"seed {cfg.seed} pretrain", place=place)
  pretrain = {"val_loss": curves["val_loss"][-1], "curves": curves, "seconds": time.perf_counter() - t0}
  print(f"seed {cfg.seed} pretrain: {curves['step_ms']:.1f} ms/step")
  state, results = nnx.state(pretrained), {}
  for row in rows:
    t0 = time.perf_counter()
    model = make_model(cfg, row.switches, state, mesh)
    curves = {}
    if row.trains:
      # Every continued run of a seed reads the same batches: they differ only in their switches.
      curves = train(model, cfg, train_data, val, steps=cfg.steps_qat, lr=cfg.lr_qat, seed=(cfg.seed, 1),
                     label=f"seed {cfg.seed} {row.key}", place=place)
      print(f"seed {cfg.seed} {row.key}: {curves['step_ms']:.1f} ms/step")
    val_loss = curves["val_loss"][-1] if row.trains else float(eval_loss(model, val))
    norms = curves.get("grad_norm", [])
    results[row.key] = {"val_loss": val_loss, "final_grad_norm": norms[-1] if norms else None,
                     "max_grad_norm": max(norms) if norms else None, "seconds": time.perf_counter() - t0,
                     "curves": curves}
    if row.key == CHECKPOINT_ROW:
      save_checkpoint(os.path.join(out_dir, f"{CHECKPOINT_ROW}_seed{cfg.seed}.npz"), model, cfg)
      if cfg.serve_tokens > 0 and mesh is None:  # the trained model served through the packed NVFP4 KV cache
        results[row.key]["serving"] = serve_lm.serve_report(model, cfg, val, tokens=cfg.serve_tokens,
                                                            prompt=min(serve_lm.CHUNK, cfg.seq_len))
  result = {"profile": profile, "seed": cfg.seed, "config": dataclasses.asdict(cfg),
            "backend": jax.default_backend(), "devices": jax.device_count(), "split": split,
            "rows_spec": [dataclasses.asdict(r) for r in rows], "pretrain": pretrain, "rows": results,
            "wall_seconds": time.perf_counter() - t_start}
  if mesh_sizes is not None:
    result["mesh"] = mesh_sizes
  path = os.path.join(out_dir, f"results_seed{cfg.seed}.json")
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {path} in {result['wall_seconds']:.0f} s")
  return result


# ----------------------------------------------------------------------------- seeds merged


def _stats(values: list) -> dict | None:
  """Mean, sample standard deviation (0 for one seed), min and max of ``values``; None when all are None."""
  v = [x for x in values if x is not None]
  if not v:
    return None
  return {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
          "min": float(np.min(v)), "max": float(np.max(v)), "n": len(v)}


def merge(seed_results: list[dict]) -> dict:
  """Per-row statistics over seeds: val loss (nats/byte), bits per byte, final and max gradient norm.

  seed_results: :func:`run_seed` results of distinct seeds and one configuration (checked).
  """
  if not seed_results:
    raise ValueError("merge: no results_seed*.json given")
  seeds = [r["seed"] for r in seed_results]
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"merge: seeds must be distinct, got {seeds}")
  strip = lambda r: {k: v for k, v in r["config"].items() if k != "seed"}
  for r in seed_results[1:]:
    if strip(r) != strip(seed_results[0]) or r["rows_spec"] != seed_results[0]["rows_spec"]:
      raise ValueError(f"merge: seed {r['seed']} ran another configuration or rows than seed {seeds[0]}")
  rows = {}
  for spec in seed_results[0]["rows_spec"]:
    runs = [r["rows"][spec["key"]] for r in seed_results]
    rows[spec["key"]] = {
        **spec, "val_loss": _stats([x["val_loss"] for x in runs]),
        "bits_per_byte": _stats([x["val_loss"] / math.log(2) for x in runs]),
        "final_grad_norm": _stats([x["final_grad_norm"] for x in runs]),
        "max_grad_norm": _stats([x["max_grad_norm"] for x in runs]),
        "step_ms": _stats([x["curves"].get("step_ms") for x in runs])}
  base = {k: v for k, v in seed_results[0].items() if k not in ("seed", "pretrain", "rows", "wall_seconds")}
  base["config"] = strip(seed_results[0])
  return {**base, "seeds": sorted(seeds), "rows": rows,
          "pretrain_step_ms": _stats([r["pretrain"]["curves"]["step_ms"] for r in seed_results])}


def format_table(merged: dict) -> str:
  """Mean +- sample std [min, max] over seeds per row; the difference of means to the BF16 control."""
  control = merged["rows"].get("bf16-cont", {"val_loss": {"mean": math.nan}})["val_loss"]["mean"]
  fmt = lambda s: "-" if s is None else f"{s['mean']:.3f}"
  lines = [f"seeds {merged['seeds']}; val loss in nats/byte: mean +- std [min, max]",
           f"{'row':<4} {'run':<44} {'val loss':>34} {'- control':>9} {'bits/byte':>9} {'final |g|':>9} "
           f"{'max |g|':>9} {'ms/step':>8}"]
  for r in merged["rows"].values():
    v = r["val_loss"]
    loss = f"{v['mean']:.4f} +- {v['std']:.4f} [{v['min']:.4f}, {v['max']:.4f}]"
    diff = "-" if math.isnan(control) else f"{v['mean'] - control:+.4f}"
    lines.append(f"{r['paper_row']:<4} {r['description']:<44} {loss:>34} {diff:>9} "
                 f"{r['bits_per_byte']['mean']:>9.4f} {fmt(r['final_grad_norm']):>9} {fmt(r['max_grad_norm']):>9} "
                 f"{fmt(r['step_ms']):>8}")
  return "\n".join(lines)


def write_merged(seed_results: list[dict], out_dir: str) -> dict:
  """``results.json`` (statistics and every seed's curves) and ``curves.png`` in ``out_dir``; prints the table."""
  os.makedirs(out_dir, exist_ok=True)
  merged = merge(seed_results)
  print(format_table(merged))
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump({**merged, "per_seed": seed_results}, f, indent=1)
  written = ["results.json"]
  try:
    _plot.ablation_curves(seed_results, merged, os.path.join(out_dir, "curves.png"))
    written.append("curves.png")
  except ImportError as e:
    print(f"no curves.png: {e}")
  print(f"wrote {', '.join(written)} to {out_dir}")
  return merged


def read_results(paths: list[str]) -> list[dict]:
  """The ``results_seed*.json`` files named by ``paths`` (files, or directories holding them), by seed."""
  files = []
  for p in paths:
    found = sorted(glob.glob(os.path.join(p, "results_seed*.json"))) if os.path.isdir(p) else [p]
    if not found:
      raise ValueError(f"--merge: no results_seed*.json in {p}")
    files += found
  results = []
  for name in files:
    with open(name) as f:
      results.append(json.load(f))
  return sorted(results, key=lambda r: r["seed"])


def parse_overrides(text: str) -> dict:
  """``"steps_qat=1000,seq_len=4096"`` -> Config field values, typed like the field's default."""
  fields = {f.name: f for f in dataclasses.fields(Config)}
  out = {}
  for part in filter(None, text.split(",")):
    name, _, value = part.partition("=")
    if name not in fields or name == "seed" or not value:
      raise ValueError(f"--set takes name=value pairs of Config fields other than seed {sorted(fields)}, "
                       f"got {part!r}")
    default = getattr(Config(), name)
    out[name] = value if default is None or isinstance(default, str) else type(default)(value)
  return out


def parse_rows(text: str) -> list[Row]:
  """``"bf16,attn-qat"`` -> those rows of :data:`ROWS`, in the table's order."""
  keys = set(filter(None, text.split(",")))
  known = [r.key for r in ROWS]
  if not keys or keys - set(known):
    raise ValueError(f"--rows takes comma-separated keys among {known}, got {text!r}")
  return [r for r in ROWS if r.key in keys]


def main(argv=None) -> dict:
  """Runs the seeds and writes the merged results (or only merges with ``--merge``); returns the merged dict."""
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=os.path.join(".", "out", "train_lm"), help="output directory")
  size = parser.add_mutually_exclusive_group()
  size.add_argument("--gpu", action="store_true", help="the long configuration (default when JAX runs on a GPU)")
  size.add_argument("--cpu", action="store_true", help="the short CPU configuration even on a GPU")
  size.add_argument("--tiny", action="store_true", help="a seconds-long smoke configuration")
  size.add_argument("--merge", nargs="+", metavar="DIR_OR_JSON",
                    help="only merge results_seed*.json from earlier runs into --out (table, results.json, plot)")
  parser.add_argument("--seeds", default="0", help="comma-separated seeds, run one after another (default 0)")
  parser.add_argument("--rows", type=parse_rows, default=ROWS, metavar="KEY,...",
                      help="run only these rows (default all; the merge needs the same rows for every seed)")
  parser.add_argument("--set", dest="overrides", type=parse_overrides, default={}, metavar="NAME=VALUE,...",
                      help="override Config fields of the profile")
  parser.add_argument("--mesh", type=parse_mesh, default=None,
                      help="data=N,seq=M: batch over N devices, attention sequence-parallel (Ulysses) over M")
  parser.add_argument("--generate", type=int, default=None, metavar="TOKENS",
                      help="after training, serve the Attn-QAT model through the packed NVFP4 KV cache: the loss "
                           "check and greedy generation of TOKENS bytes vs a BF16 cache (default: the profile's "
                           "serve_tokens; 0 skips; one device only)")
  args = parser.parse_args(argv)
  if args.merge:
    return write_merged(read_results(args.merge), args.out)
  try:
    seeds = [int(s) for s in args.seeds.split(",")]
  except ValueError:
    raise ValueError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
  profile = ("tiny" if args.tiny else "gpu" if args.gpu else "cpu" if args.cpu
             else "gpu" if jax.default_backend() == "gpu" else "cpu")
  cfg = dataclasses.replace(CONFIGS[profile], **args.overrides)
  if args.generate is not None:
    cfg = dataclasses.replace(cfg, serve_tokens=args.generate)
  results = [run_seed(dataclasses.replace(cfg, seed=s), args.out, profile=profile, mesh_sizes=args.mesh,
                      rows=args.rows) for s in seeds]
  return write_merged(results, args.out)


if __name__ == "__main__":
  jqat.enable_compilation_cache()
  main()
