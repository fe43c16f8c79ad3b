#!/usr/bin/env bash
# Run 39c: the GPU files not run to the end on the final trees of run 38 / 39, and the CPU suite's reference and
# numerics files on XLA:GPU (docs/logs/run40_suite_on_gpu.sh group 1: XLA's GPU division, run 38), time-boxed.
source .device/setup.sh
for f in tests/test_numerics_modes_triton.py tests/test_numerics_modes.py tests/test_nan.py \
         tests/test_attention_reference.py tests/test_nvfp4.py; do
  left=$((575 - SECONDS)); [ $left -lt 30 ] && { echo "$f: not reached" >> $OUT/C_suite.log; continue; }
  timeout $left python3 -m pytest -q -p no:cacheprovider -rf $f > $OUT/C_$(basename $f .py).log 2>&1
  echo "$f: $(tail -1 $OUT/C_$(basename $f .py).log)" >> $OUT/C_suite.log
done
cat $OUT/C_suite.log; echo "elapsed $SECONDS s"
