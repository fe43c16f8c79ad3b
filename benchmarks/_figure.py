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
