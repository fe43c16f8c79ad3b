"""List-scheduling model of an attention grid's tail (run 37): 264 slots (132 SMs x 2 programs of 4 warps), each
program's length its KV walk in tiles of 64 (the diagonal tile of a causal walk 1.23x: the masked loop's SASS
length over the unmasked one's, 1214 / 1025 rounded), programs started in the given order as slots free up.
Prints the makespan over the ideal (total work / slots) for three orders of a causal forward's query tiles:
launch order (tile fastest, ascending), each head's tiles descending, and tile-major descending (heads together,
longest first: ``attention_common.program_tile``), at the issue-13 shapes; and the non-causal grid for scale.
  python run37_schedule_model.py"""
import heapq


def makespan(jobs, slots=264):
  free = [0.0] * slots
  end = 0.0
  for w in jobs:
    t = heapq.heappop(free) + w
    end = max(end, t)
    heapq.heappush(free, t)
  return end


for s, heads in ((4096, 16), (16384, 16), (8192, 32)):
  n = s // 64
  work = [m + 1 + 0.23 for m in range(n)]  # tiles walked by query tile m, its last one masked
  orders = {"launch order": [work[m] for h in range(heads) for m in range(n)],
            "per head descending": [work[n - 1 - m] for h in range(heads) for m in range(n)],
            "tile-major descending": [work[n - 1 - m] for m in range(n) for h in range(heads)]}
  ideal = sum(work) * heads / 264
  line = ", ".join(f"{k} {makespan(v) / ideal:.3f}" for k, v in orders.items())
  full = [float(n)] * (n * heads)
  print(f"S={s} heads={heads} causal: ideal {ideal:.1f} tile-waves; makespan / ideal: {line}; "
        f"non-causal {makespan(full) / (sum(full) / 264):.3f}")
