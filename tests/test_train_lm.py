"""The training demo (examples/train_lm.py): the tiny configuration end to end, the seed merge, RoPE, checkpoints."""

import copy
import importlib.util
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
import train_lm  # noqa: E402
from conftest import assert_close

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
TESTED_ROWS = ["bf16", "bf16-cont", "fp4", "attn-qat"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """One seed of the tiny profile, the rows of each kind (CI time: every trained row compiles a training step;
  the other rows differ only in jqat switches, tested in jqat's own tests): (output directory, merged results)."""
  out = tmp_path_factory.mktemp("tiny")
  return out, train_lm.main(["--tiny", "--seeds", "3", "--rows", ",".join(TESTED_ROWS), "--out", str(out)])


def test_tiny_demo_runs_every_row(tiny_run):
  out, merged = tiny_run
  assert [r.paper_row for r in train_lm.ROWS] == ["1", "1c", "2", "3", "4", "5", "6", "7", "8"]
  assert list(merged["rows"]) == TESTED_ROWS
  with open(out / "results_seed3.json") as f:
    seed = json.load(f)
  assert seed["seed"] == 3 and seed["config"]["seed"] == 3 and merged["seeds"] == [3]
  split = seed["split"]
  assert split["train"]["files"] > 0 and split["val"]["files"] > 0 and split["val"]["bytes"] > 0
  assert len(split["train"]["file_list_sha256"]) == 64
  pre = seed["pretrain"]["curves"]
  assert len(pre["loss"]) == train_lm.CONFIGS["tiny"].steps_pretrain and pre["step_ms"] > 0
  for row in train_lm.parse_rows(",".join(TESTED_ROWS)):
    run = seed["rows"][row.key]
    assert math.isfinite(run["val_loss"])
    if row.trains:
      assert len(run["curves"]["loss"]) == train_lm.CONFIGS["tiny"].steps_qat
      assert np.isfinite(run["curves"]["loss"]).all() and np.isfinite(run["curves"]["grad_norm"]).all()
      assert run["max_grad_norm"] >= run["final_grad_norm"] > 0
      # Every continued run starts from the pretrained weights: its step-0 validation is that model's loss
      # under its forward (BF16 for the control; the default NVFP4 forward for rows 4, 7, 8).
      same_forward = {"bf16-cont": "bf16", "attn-qat": "fp4", "-hp-o": "fp4", "-fq-p-bwd": "fp4"}.get(row.key)
      if same_forward is not None:
        assert_close(run["curves"]["val_loss"][0], seed["rows"][same_forward]["val_loss"], rel=1e-5,
                     name=f"{row.key} step-0 val loss")
    else:
      assert run["curves"] == {} and run["max_grad_norm"] is None
  # Rows 1 and 2: the same weights, a different forward (NVFP4 attention).
  assert seed["rows"]["fp4"]["val_loss"] != seed["rows"]["bf16"]["val_loss"]
  assert seed["rows"]["bf16"]["val_loss"] == seed["pretrain"]["val_loss"]
  stats = merged["rows"]["attn-qat"]["val_loss"]
  assert stats["n"] == 1 and stats["std"] == 0 and stats["mean"] == seed["rows"]["attn-qat"]["val_loss"]
  if HAS_MATPLOTLIB:
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # The Attn-QAT model served through the packed NVFP4 KV cache (examples/serve_lm.py).
  serving = seed["rows"]["attn-qat"]["serving"]
  assert serving["loss_check_passed"] and serving["val_loss_difference"] <= 1e-3
  assert serving["tokens"] == train_lm.CONFIGS["tiny"].serve_tokens and 0 <= serving["agreement"] <= 1
  assert serving["packed_tokens_per_s"] > 0 and serving["bf16_tokens_per_s"] > 0


def test_merge_of_separate_seed_files(tiny_run, tmp_path):
  """Seeds written by separate processes merge from their JSON files: mean, sample std, min, max per row."""
  out, _ = tiny_run
  with open(out / "results_seed3.json") as f:
    first = json.load(f)
  dirs = []
  for seed, shift in ((3, 0.0), (4, 0.5), (5, 1.0)):
    run = copy.deepcopy(first)
    run["seed"] = run["config"]["seed"] = seed
    for row in run["rows"].values():
      row["val_loss"] += shift
    d = tmp_path / f"s{seed}"
    d.mkdir()
    (d / f"results_seed{seed}.json").write_text(json.dumps(run))
    dirs.append(str(d))
  merged = train_lm.main(["--merge", *dirs, "--out", str(tmp_path / "all")])
  assert merged["seeds"] == [3, 4, 5]
  base = first["rows"]["attn-qat"]["val_loss"]
  s = merged["rows"]["attn-qat"]["val_loss"]
  assert s["n"] == 3 and s["min"] == base and s["max"] == base + 1.0
  assert s["mean"] == pytest.approx(base + 0.5) and s["std"] == pytest.approx(0.5)
  assert merged["rows"]["attn-qat"]["bits_per_byte"]["mean"] == pytest.approx((base + 0.5) / math.log(2))
  saved = json.loads((tmp_path / "all" / "results.json").read_text())
  assert [r["seed"] for r in saved["per_seed"]] == [3, 4, 5]
  if HAS_MATPLOTLIB:
    assert (tmp_path / "all" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with pytest.raises(ValueError, match="distinct"):
    train_lm.merge([first, first])
  other = copy.deepcopy(first)
  other["seed"], other["config"]["steps_qat"] = 9, 99
  with pytest.raises(ValueError, match="another configuration"):
    train_lm.merge([first, other])


def test_checkpoint_round_trip(tiny_run):
  """The Attn-QAT row's .npz (no pickle) rebuilds the model: its validation loss is the row's."""
  out, merged = tiny_run
  path = out / "attn-qat_seed3.npz"
  with np.load(path, allow_pickle=False) as f:
    assert json.loads(str(f["__config__"]))["seed"] == 3
  model, cfg = train_lm.load_checkpoint(str(path), {})
  _, val_data, _ = train_lm.load_corpus(cfg)
  loss = train_lm.eval_loss(model, jnp.asarray(train_lm.val_batches(val_data, cfg)))
  # A second compilation of the same program: reassociation-level differences only.
  assert_close(loss, merged["rows"]["attn-qat"]["val_loss"]["mean"], rel=1e-5, name="val loss")
  with pytest.raises(ValueError, match="missing or of another shape"):
    train_lm.load_checkpoint(str(path), {}, d_model=32)


def test_rope_scores_depend_on_relative_position():
  """RoPE: q_i . k_j after rotation depends on j - i only, and the rotation keeps norms."""
  rng = np.random.default_rng(0)
  q, k = (np.repeat(rng.normal(size=(1, 1, 2, 8)), 40, axis=1).astype(np.float32) for _ in range(2))
  rq, rk = (np.asarray(train_lm.rope(jnp.asarray(x), 10000.0), np.float64) for x in (q, k))
  scores = np.einsum("bind,bjnd->bnij", rq, rk)[0]  # [N, T, T]
  for shift in (1, 7, 25):
    np.testing.assert_allclose(scores[:, shift:, shift:], scores[:, :-shift, :-shift], rtol=1e-5, atol=1e-5)
  assert not np.allclose(scores[:, 0, 1], scores[:, 0, 2])  # and it does depend on the distance
  np.testing.assert_allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-6)
  assert train_lm.rope(jnp.asarray(q, jnp.bfloat16), 10000.0).dtype == jnp.bfloat16


def test_command_line_checks():
  assert train_lm.parse_overrides("steps_qat=7,lr_qat=0.1,implementation=xla") == dict(
      steps_qat=7, lr_qat=0.1, implementation="xla")
  with pytest.raises(ValueError, match="Config fields"):
    train_lm.parse_overrides("seed=3")
  with pytest.raises(ValueError, match="Config fields"):
    train_lm.parse_overrides("steps=3")
  assert [r.key for r in train_lm.parse_rows("-hp-o,bf16")] == ["bf16", "-hp-o"]  # the table's order
  with pytest.raises(ValueError, match="--rows"):
    train_lm.parse_rows("bf16,row9")
  with pytest.raises(ValueError, match="--seeds"):
    train_lm.main(["--tiny", "--seeds", "0,x"])


def test_split_is_deterministic():
  cfg = train_lm.CONFIGS["tiny"]
  _, _, first = train_lm.load_corpus(cfg)
  _, _, second = train_lm.load_corpus(cfg)
  assert first == second
