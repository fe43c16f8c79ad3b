"""Nsight Compute's per-launch counters as JSON, for ``report.py`` (docs/PERFORMANCE.md's "what bounds it").

  ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
      --section ComputeWorkloadAnalysis -o fb python3 benchmarks/ncu_attention.py --seq 16384 --btnh
  ncu --import fb.ncu-rep --print-details all > fb.txt
  python benchmarks/ncu_counters.py fb.txt --kernels 'attention|quantize' --out counters.json

Reads the text that ``ncu --import REPORT --print-details all`` prints: for each launch its kernel name, grid and
block, and every "name [unit] value" row of its sections (the first row of a name wins: ncu repeats some names, e.g.
"ALU" of elapsed and of active cycles, elapsed first). ``--kernels`` keeps the launches whose name matches; a kernel
launched again with the same grid and block keeps its last launch (the first of a script is often the compiling call's).
Nothing is measured here: the values are ncu's, converted to plain numbers (durations to ms).
"""

from __future__ import annotations

import argparse
import json
import re

_LAUNCH = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
_TO_MS = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}


def _number(text: str) -> float | None:
  try:
    return float(text.replace(",", ""))
  except ValueError:
    return None


def parse(text: str) -> list[dict]:
  """Each launch of ``ncu --print-details all``'s text: ``{"kernel", "grid", "block", "metrics": {name: value}}``,
  with ``metrics["Duration"]`` in ms."""
  launches = []
  for line in text.splitlines():
    m = _LAUNCH.match(line)
    if m:
      launches.append({"kernel": m.group(1), "grid": [int(g) for g in m.group(2, 3, 4)],
                       "block": [int(b) for b in m.group(5, 6, 7)], "metrics": {}})
      continue
    # metric rows are indented 4; deeper lines continue a rule's text or a wrapped chart
    if not launches or not line.startswith("    ") or line.startswith(" " * 10):
      continue
    parts = re.split(r"\s{2,}", line.strip())
    if len(parts) not in (2, 3):
      continue
    value = _number(parts[-1])  # None for headers ("Metric Value") and text
    if value is None:
      continue
    name, unit = parts[0], (parts[1] if len(parts) == 3 else "")
    if name == "Duration":
      if unit not in _TO_MS:
        continue
      value *= _TO_MS[unit]
    launches[-1]["metrics"].setdefault(name, value)
  return launches


def select(launches: list[dict], kernels: str | None) -> list[dict]:
  """The launches whose kernel name matches ``kernels`` (all if None), the last of each (name, grid, block) with the
  number of such launches (``"launches"``), in the order of their first launch."""
  kept: dict[tuple, dict] = {}  # a key assigned again keeps its first place
  for launch in launches:
    if kernels is None or re.search(kernels, launch["kernel"]):
      key = (launch["kernel"], *launch["grid"], *launch["block"])
      kept[key] = {**launch, "launches": kept.get(key, {}).get("launches", 0) + 1}
  return list(kept.values())


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("details", nargs="+", help="files of `ncu --import REPORT --print-details all`")
  ap.add_argument("--kernels", default=None, help="a regular expression the kernel names must match")
  ap.add_argument("--label", action="append", default=None,
                  help="a label per details file (the shape or command it profiled); default the file name")
  ap.add_argument("--out", default="counters.json")
  args = ap.parse_args()
  labels = args.label or args.details
  if len(labels) != len(args.details):
    ap.error("--label: give one per details file")
  rows = []
  for path, label in zip(args.details, labels):
    with open(path) as f:
      for launch in select(parse(f.read()), args.kernels):
        rows.append({"label": label, **launch})
  if not rows:
    raise SystemExit(f"no launch{' matching ' + repr(args.kernels) if args.kernels else ''} in {args.details}")
  with open(args.out, "w") as f:
    json.dump({"benchmark": "ncu_counters", "rows": rows}, f, indent=1)
  print(f"{len(rows)} launches -> {args.out}")


if __name__ == "__main__":
  main()
