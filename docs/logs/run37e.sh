#!/usr/bin/env bash
# Run 37e: the final tree. Issue 13's shapes with cuDNN, the masks benchmark, then GPU tests (time-boxed).
source .device/setup.sh
timeout 170 python3 benchmarks/ab_attention.py --iters 10 --repeats 5 --shapes 0,1,2,4,5,6,7 --cudnn --out $OUT/E_ab.json 2>&1 | grep -v -i warn > $OUT/E_ab.log
cat $OUT/E_ab.log
timeout 100 python3 benchmarks/masks.py --out $OUT/E_masks.json 2>&1 | grep -v -i warn | tail -5 > $OUT/E_masks.log
cat $OUT/E_masks.log
for f in test_tile_ranges test_nan test_masks test_torch; do
  left=$((560 - SECONDS)); [ $left -lt 20 ] && break
  echo "$f: $(timeout $left python3 -m pytest -q -p no:cacheprovider tests/$f.py 2>&1 | tail -1)" >> $OUT/E_gpu_tests.log
done
cat $OUT/E_gpu_tests.log
