"""The training demo's figure (matplotlib, the ``demo`` extra): the ablation's curves, mean over seeds and a band.

Top row: the BF16 pretraining every row starts from. Bottom row: the continued runs on their own x-range
(steps since the end of pretraining), so the QAT differences are not squeezed against the pretraining's
early losses. One column per metric: train loss, validation loss, gradient norm before clipping.
"""

from __future__ import annotations

import numpy as np


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
  """Trailing moving average over ``window`` steps (the first points average what exists); y: [seeds, steps]."""
  c = np.cumsum(np.pad(y, ((0, 0), (1, 0))), axis=1)
  n = np.arange(1, y.shape[1] + 1)
  lo = np.maximum(n - window, 0)
  return (c[:, n] - c[:, lo]) / (n - lo)


def _band(ax, x, ys: np.ndarray, label: str, color, **kw):
  """Mean line of ``ys`` [seeds, len(x)] and a min-max band when there are several seeds."""
  ax.plot(x, ys.mean(0), color=color, label=label, lw=1.2, **kw)
  if ys.shape[0] > 1:
    ax.fill_between(x, ys.min(0), ys.max(0), color=color, alpha=0.2, lw=0)


def ablation_curves(seed_results: list[dict], merged: dict, path: str):
  """Saves the 2 x 3 figure to ``path``.

  seed_results: ``examples/train_lm.py``'s per-seed results (curves of one configuration);
  merged: their ``merge`` (row order, labels, evaluation-only rows' statistics).
  Raises ImportError (with the install hint) when matplotlib is missing.
  """
  try:
    import matplotlib
  except ImportError:
    raise ImportError("matplotlib is not installed (pip install 'jqat[demo]' or pip install matplotlib)") from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(2, 3, figsize=(16, 9), constrained_layout=True)
  colors = plt.get_cmap("tab10").colors
  n_seeds = len(seed_results)
  spread = f"mean over {n_seeds} seeds, band min-max" if n_seeds > 1 else "one seed"
  metrics = [("loss", "train loss (nats/byte, moving average)"), ("val_loss", "validation loss (nats/byte)"),
             ("grad_norm", "gradient norm before clipping")]

  def draw(ax_row, runs: dict, *, phase: str):
    for col, (metric, title) in enumerate(metrics):
      ax = ax_row[col]
      for i, (label, curves) in enumerate(runs.items()):
        x = np.asarray(curves[0]["val_step" if metric == "val_loss" else "step"])
        ys = np.array([c[metric] for c in curves], np.float64)
        if metric == "loss":
          ys = _smooth(ys, max(1, len(x) // 25))
        _band(ax, x, ys, label, colors[i % len(colors)], marker="." if metric == "val_loss" else None)
      ax.set_title(f"{phase}: {title}", fontsize=10)
      ax.set_xlabel("step" if phase == "pretraining" else "step of the continued run")
      if metric == "grad_norm":
        ax.set_yscale("log")
      ax.grid(alpha=0.3)

  draw(axes[0], {"BF16 pretraining": [r["pretrain"]["curves"] for r in seed_results]}, phase="pretraining")
  trained = [k for k, r in merged["rows"].items() if r["trains"]]
  label = lambda k: f"{merged['rows'][k]['paper_row']} {merged['rows'][k]['description']}"
  draw(axes[1], {label(k): [r["rows"][k]["curves"] for r in seed_results] for k in trained},
       phase="continued")
  # Evaluation-only rows (no training): their loss as a point with a min-max bar at step 0.
  ax = axes[1][1]
  for i, k in enumerate(k for k, r in merged["rows"].items() if not r["trains"]):
    s = merged["rows"][k]["val_loss"]
    ax.errorbar([0], [s["mean"]], yerr=[[s["mean"] - s["min"]], [s["max"] - s["mean"]]], fmt="x", capsize=3,
                color=colors[(len(trained) + i) % len(colors)], label=label(k))
  axes[1][1].legend(fontsize=7)
  axes[0][1].legend(fontsize=8)
  fig.suptitle(f"Attn-QAT ablation, profile {merged['profile']} ({spread})")
  fig.savefig(path, dpi=110)
  plt.close(fig)
