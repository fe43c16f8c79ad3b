#!/usr/bin/env bash
# Run 37f: the GPU test files that run 36 did not reach, on the final tree (time-boxed).
source .device/setup.sh
for f in test_attention_triton test_numerics_modes_triton; do
  left=$((530 - SECONDS)); [ $left -lt 20 ] && break
  timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests/$f.py 2>&1 | tail -4 > $OUT/F_$f.log
  echo "$f: $(tail -1 $OUT/F_$f.log)" >> $OUT/F_gpu_tests.log
done
cat $OUT/F_gpu_tests.log
