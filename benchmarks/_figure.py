"""matplotlib for the benchmark scripts' figures: optional (the ``demo`` extra) and headless."""

from __future__ import annotations


def pyplot():
  """``matplotlib.pyplot`` on the non-interactive Agg backend, or None (with a note) when matplotlib is missing."""
  try:
    import matplotlib  # noqa: PLC0415  (optional)
  except ImportError:
    print("matplotlib not installed: no plot")
    return None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  return plt


def save(fig, path: str) -> None:
  """Lay the figure out, write it to ``path`` at the benchmarks' resolution and say so."""
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print("wrote", path)
