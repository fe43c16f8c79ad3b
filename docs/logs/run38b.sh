#!/usr/bin/env bash
# Run 38b: masks benchmark and GPU tests on the patched tree (time-boxed).
source .device/setup.sh
timeout 110 python3 benchmarks/masks.py --out $OUT/B_masks.json 2>&1 | grep -v -i warn | tail -5 > $OUT/B_masks.log
cat $OUT/B_masks.log
for f in test_masks test_numerics_modes_triton test_tile_ranges; do
  left=$((570 - SECONDS)); [ $left -lt 20 ] && break
  timeout $left python3 -m pytest -q -p no:cacheprovider tests/$f.py 2>&1 | tail -3 > $OUT/B_$f.log
  echo "$f: $(tail -1 $OUT/B_$f.log)" >> $OUT/B_gpu_tests.log
done
cat $OUT/B_gpu_tests.log
