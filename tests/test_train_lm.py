"""Smoke test of the training demo (examples/train_lm.py) in its tiny configuration."""

import json
import math

import numpy as np
import train_lm  # noqa: E402


def test_tiny_demo_runs_all_five_runs(tmp_path):
  summary = train_lm.main(["--tiny", "--out", str(tmp_path)])
  assert list(summary["runs"]) == ["a", "b", "c", "d", "e"]
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert saved["runs"].keys() == summary["runs"].keys()
  split = saved["split"]
  assert split["train"]["files"] > 0 and split["val"]["files"] > 0 and split["val"]["bytes"] > 0
  assert len(split["train"]["file_list_sha256"]) == 64
  for name, run in saved["runs"].items():
    assert math.isfinite(run["val_loss"]) and math.isclose(run["bits_per_byte"], run["val_loss"] / math.log(2))
    if name == "b":  # evaluation only
      assert run["curves"] == {} and run["max_grad_norm"] is None
    else:
      assert np.isfinite(run["curves"]["loss"]).all() and np.isfinite(run["curves"]["grad_norm"]).all()
      assert run["max_grad_norm"] >= run["final_grad_norm"] > 0
  # Same weights, different forward: (b) is (a)'s model evaluated with NVFP4 attention.
  assert saved["runs"]["b"]["val_loss"] != saved["runs"]["a"]["val_loss"]
  png = (tmp_path / "curves.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_split_is_deterministic():
  cfg = train_lm.CONFIGS["tiny"]
  _, _, first = train_lm.load_corpus(cfg)
  _, _, second = train_lm.load_corpus(cfg)
  assert first == second
