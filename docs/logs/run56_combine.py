"""Run 56a's table in docs/BENCHMARKS.md: the two processes' rows of docs/logs/run56_fwd.py pooled, per shape the
median, min and max of the twelve ratios, how many lie above 2.0, and the medians of the two columns' ms.
  python3 docs/logs/run56_combine.py docs/logs/run56a_out/run56a_fwd_1.json docs/logs/run56a_out/run56a_fwd_2.json"""
import json, statistics, sys

rows = [r for path in sys.argv[1:] for r in json.load(open(path))["rows"]]
for shape in dict.fromkeys(tuple(r["shape"]) for r in rows):
  mine = [r for r in rows if tuple(r["shape"]) == shape]
  ratios = sorted(r["ratio_fwd"] for r in mine)
  print(list(shape), f"n={len(ratios)} ratio median {statistics.median(ratios):.3f} min {ratios[0]:.3f} "
        f"max {ratios[-1]:.3f} above 2.0: {sum(x > 2.0 for x in ratios)}",
        f"jqat {statistics.median(r['jqat_fwd'] for r in mine):.4f} cudnn {statistics.median(r['cudnn_fwd'] for r in mine):.4f}")
