"""Stall samples per SASS instruction from an Nsight Compute source-page CSV (run 45c):
  ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SOURCE.csv
  python3 docs/logs/run45_stalls.py SOURCE.csv [TOP]
Per kernel: the share of all warp samples by stall reason, the share in the hot loop (the instructions executed at
least half as often as the most executed one), the samples by opcode, and the TOP instructions by samples with
their two largest reasons and what precedes them."""
import csv, collections, sys

path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
kernels, cur = {}, None
with open(path, newline="") as f:
  rows = list(csv.reader(f))
i = 0
while i < len(rows):
  r = rows[i]
  if r and r[0] == "Kernel Name":
    cur = r[1]
    header = rows[i + 1]
    kernels[cur] = []
    i += 2
    continue
  if cur and len(r) == len(header):
    kernels[cur].append(dict(zip(header, r)))
  i += 1

num = lambda v: float(v) if v not in ("", "-") else 0.0
for name, ins in kernels.items():
  reasons = [h for h in ins[0] if h.startswith("stall_") and "(Not Issued)" not in h]
  total = sum(num(x["Warp Stall Sampling (All Samples)"]) for x in ins)
  execd = [num(x["Instructions Executed"]) for x in ins]
  hot = max(execd) * 0.5
  loop = [x for x, e in zip(ins, execd) if e >= hot]
  loop_samples = sum(num(x["Warp Stall Sampling (All Samples)"]) for x in loop)
  print(f"== {name}: {len(ins)} instructions, {total:.0f} samples; hot loop {len(loop)} instructions, "
        f"{100 * loop_samples / total:.1f}% of samples")
  by_reason = collections.Counter()
  for x in ins:
    for h in reasons:
      by_reason[h[6:]] += num(x[h])
  print("  by reason (% of all samples):",
        ", ".join(f"{k} {100 * v / total:.1f}" for k, v in by_reason.most_common() if v / total >= 0.005))
  by_op = collections.Counter()
  for x in loop:
    op = x["Source"].split()[0] if not x["Source"].split()[0].startswith("@") else x["Source"].split()[1]
    by_op[op.split(".")[0]] += num(x["Warp Stall Sampling (All Samples)"])
  print("  hot loop by opcode (% of all samples):",
        ", ".join(f"{k} {100 * v / total:.1f}" for k, v in by_op.most_common(14)))
  order = sorted(range(len(ins)), key=lambda j: -num(ins[j]["Warp Stall Sampling (All Samples)"]))
  for j in order[:top]:
    x = ins[j]
    rs = sorted(((num(x[h]), h[6:]) for h in reasons), reverse=True)[:2]
    prev = ins[j - 1]["Source"].strip() if j else ""
    print(f"  {100 * num(x['Warp Stall Sampling (All Samples)']) / total:5.2f}%  #{j:4d} {x['Source'].strip()[:60]:60s} "
          f"{rs[0][1]} {100 * rs[0][0] / total:.2f}, {rs[1][1]} {100 * rs[1][0] / total:.2f}  | after: {prev[:40]}")
