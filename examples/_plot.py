"""A dependency-free PNG line plot (NumPy + zlib): axes, ticks, colored lines, a legend.

Text uses a built-in 3x5 pixel font (upper-case letters, digits, a little
punctuation), enough for titles, tick labels and legend entries.
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np

COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]

# 3x5 glyphs: five rows of three pixels, top to bottom ('#' = ink).
_FONT = {
    "0": "### #.# #.# #.# ###", "1": ".#. ##. .#. .#. ###", "2": "### ..# ### #.. ###", "3": "### ..# .## ..# ###",
    "4": "#.# #.# ### ..# ..#", "5": "### #.. ### ..# ###", "6": "### #.. ### #.# ###", "7": "### ..# .#. .#. .#.",
    "8": "### #.# ### #.# ###", "9": "### #.# ### ..# ###", "A": ".#. #.# ### #.# #.#", "B": "##. #.# ##. #.# ##.",
    "C": ".## #.. #.. #.. .##", "D": "##. #.# #.# #.# ##.", "E": "### #.. ##. #.. ###", "F": "### #.. ##. #.. #..",
    "G": ".## #.. #.# #.# .##", "H": "#.# #.# ### #.# #.#", "I": "### .#. .#. .#. ###", "J": "..# ..# ..# #.# .#.",
    "K": "#.# #.# ##. #.# #.#", "L": "#.. #.. #.. #.. ###", "M": "#.# ### ### #.# #.#", "N": "##. #.# #.# #.# #.#",
    "O": ".#. #.# #.# #.# .#.", "P": "##. #.# ##. #.. #..", "Q": ".#. #.# #.# ##. .##", "R": "##. #.# ##. #.# #.#",
    "S": ".## #.. .#. ..# ##.", "T": "### .#. .#. .#. .#.", "U": "#.# #.# #.# #.# ###", "V": "#.# #.# #.# #.# .#.",
    "W": "#.# #.# ### ### #.#", "X": "#.# #.# .#. #.# #.#", "Y": "#.# #.# .#. .#. .#.", "Z": "### ..# .#. #.. ###",
    ".": "... ... ... ... .#.", ",": "... ... ... .#. #..", "-": "... ... ### ... ...", "+": "... .#. ### .#. ...",
    ":": "... .#. ... .#. ...", "(": "..# .#. .#. .#. ..#", ")": "#.. .#. .#. .#. #..", "/": "..# ..# .#. #.. #..",
    "=": "... ### ... ### ...", "_": "... ... ... ... ###", "'": ".#. .#. ... ... ...", " ": "... ... ... ... ...",
    "%": "#.# ..# .#. #.. #.#",
}


def _glyph(ch: str) -> np.ndarray:
  return np.array([[c == "#" for c in row] for row in _FONT.get(ch.upper(), _FONT[" "]).split()], bool)


def text_size(s: str, scale: int = 2) -> tuple[int, int]:
  """(height, width) in pixels of ``s`` drawn by :func:`draw_text`."""
  return 5 * scale, max(len(s) * 4 * scale - scale, 0)


def draw_text(img, y: int, x: int, s: str, color=(0, 0, 0), scale: int = 2):
  """Draws ``s`` with its top-left corner at (y, x); clipped to the image."""
  for i, ch in enumerate(s):
    mask = np.kron(_glyph(ch), np.ones((scale, scale), bool))
    y0, x0 = y, x + i * 4 * scale
    ys, xs = np.nonzero(mask)
    ys, xs = ys + y0, xs + x0
    ok = (ys >= 0) & (ys < img.shape[0]) & (xs >= 0) & (xs < img.shape[1])
    img[ys[ok], xs[ok]] = color


def draw_line(img, y0, x0, y1, x1, color, width: int = 2):
  """Anti-alias-free polyline segment: dense sampling, ``width`` pixels thick."""
  n = int(max(abs(y1 - y0), abs(x1 - x0))) + 1
  ys = np.rint(np.linspace(y0, y1, n)).astype(int)
  xs = np.rint(np.linspace(x0, x1, n)).astype(int)
  for dy in range(width):
    for dx in range(width):
      yy, xx = ys + dy - width // 2, xs + dx - width // 2
      ok = (yy >= 0) & (yy < img.shape[0]) & (xx >= 0) & (xx < img.shape[1])
      img[yy[ok], xx[ok]] = color


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
  """About ``n`` round tick values covering [lo, hi]."""
  step = (hi - lo) / max(n - 1, 1)
  mag = 10 ** math.floor(math.log10(step))
  step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= step), default=10 * mag)
  first = math.ceil(lo / step - 1e-9) * step
  return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _log_ticks(lo: float, hi: float) -> list[float]:
  """log10 of the values 1, 2, 5 x 10**k inside [10**lo, 10**hi]; decades only when those are many."""
  decades = range(math.floor(lo), math.ceil(hi) + 1)
  ticks = [math.log10(m) + k for k in decades for m in (1, 2, 5) if lo <= math.log10(m) + k <= hi]
  return [t for t in ticks if abs(t - round(t)) < 1e-9] if len(ticks) > 8 else ticks


def _fmt(v: float) -> str:
  return f"{v:.4g}".replace("e-0", "e-").replace("e+0", "e")


def draw_panel(img, top: int, left: int, height: int, width: int, title: str, series, *,
               log_y: bool = False, x_label: str = ""):
  """One chart in the box (top, left, height, width) of ``img``.

  series: list of ``(label, xs, ys, color)``; non-finite points are skipped. With
  ``log_y`` the axis is log10 (non-positive values skipped) and ticks are powers of 10.
  """
  tf = (lambda v: np.log10(v)) if log_y else (lambda v: v)
  clean = []
  for label, xs, ys, color in series:
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    ok = np.isfinite(xs) & np.isfinite(ys) & ((ys > 0) if log_y else True)
    clean.append((label, xs[ok], tf(ys[ok]), color))
  all_x = np.concatenate([c[1] for c in clean] + [np.zeros(0)])
  all_y = np.concatenate([c[2] for c in clean] + [np.zeros(0)])
  x_lo, x_hi = (all_x.min(), all_x.max()) if all_x.size else (0.0, 1.0)
  y_lo, y_hi = (all_y.min(), all_y.max()) if all_y.size else (0.0, 1.0)
  x_hi, y_hi = max(x_hi, x_lo + 1e-9), max(y_hi, y_lo + 1e-9)
  pad = 0.05 * (y_hi - y_lo)
  y_lo, y_hi = y_lo - pad, y_hi + pad
  # Plot area inside the panel, leaving room for the title, tick labels and the x label.
  py0, py1, px0, px1 = top + 24, top + height - 34, left + 70, left + width - 10
  to_px = lambda x, y: (py1 - (y - y_lo) / (y_hi - y_lo) * (py1 - py0), px0 + (x - x_lo) / (x_hi - x_lo) * (px1 - px0))
  draw_text(img, top + 4, px0, title)
  grid, ink = (225, 225, 225), (0, 0, 0)
  y_ticks = _log_ticks(y_lo, y_hi) if log_y else _ticks(y_lo, y_hi)
  for t in y_ticks:
    y, _ = to_px(x_lo, t)
    draw_line(img, y, px0, y, px1, grid, width=1)
    s = _fmt(10 ** t if log_y else t)
    h, w = text_size(s)
    draw_text(img, int(y) - h // 2, px0 - 6 - w, s)
  for t in _ticks(x_lo, x_hi):
    _, x = to_px(t, y_lo)
    draw_line(img, py0, x, py1, x, grid, width=1)
    s = _fmt(t)
    draw_text(img, py1 + 6, int(x) - text_size(s)[1] // 2, s)
  draw_line(img, py0, px0, py1, px0, ink, width=1)
  draw_line(img, py1, px0, py1, px1, ink, width=1)
  if x_label:
    draw_text(img, py1 + 20, (px0 + px1 - text_size(x_label)[1]) // 2, x_label)
  for _, xs, ys, color in clean:
    pts = [to_px(x, y) for x, y in zip(xs, ys)]
    for (ya, xa), (yb, xb) in zip(pts[:-1], pts[1:]):
      draw_line(img, ya, xa, yb, xb, color)
    if len(pts) == 1:  # a single value: a visible dot
      draw_line(img, pts[0][0], pts[0][1] - 2, pts[0][0], pts[0][1] + 2, color, width=4)
  # Legend: colored boxes with labels, top-right corner of the plot area.
  labels = [c[0] for c in clean]
  lw = max((text_size(s)[1] for s in labels), default=0) + 26
  for i, (label, _, _, color) in enumerate(clean):
    y, x = py0 + 6 + 16 * i, px1 - lw - 6
    img[y:y + 10, x:x + 16] = color
    draw_text(img, y, x + 22, label)


def save_png(path: str, img: np.ndarray):
  """Writes an [H, W, 3] uint8 image as an 8-bit RGB PNG."""
  h, w, _ = img.shape
  rows = np.concatenate([np.zeros((h, 1), np.uint8), img.reshape(h, w * 3)], axis=1)  # filter 0 per row

  def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

  with open(path, "wb") as f:
    f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + chunk(b"IEND", b""))


def plot(path: str, panels, *, panel_size=(420, 560)):
  """Saves side-by-side panels to ``path``; each panel is a dict of :func:`draw_panel` arguments."""
  h, w = panel_size
  img = np.full((h, w * len(panels), 3), 255, np.uint8)
  for i, panel in enumerate(panels):
    draw_panel(img, 0, i * w, h, w, **panel)
  save_png(path, img)
