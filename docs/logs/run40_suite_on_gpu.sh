#!/usr/bin/env bash
# Prepared in session 10 (run 38) as run39b_suite_on_gpu.sh, renamed in session 11 (run 39 used the name run39b for
# another call): the CPU suite's files that never ran to the end with JAX on the GPU backend. Run 38 found that
# XLA's GPU division is not correctly rounded (the reference's tensor scales, fixed with div_rn); run 8 found the
# RoPE reference's signed zeros. The bitwise and float64 tests of these files (reference, quantizer, numerics
# modes, properties) are the ones such a difference fails. One group per call:
#   bash .device/run40_suite_on_gpu.sh 1   # the reference and the quantizer
#   bash .device/run40_suite_on_gpu.sh 2   # Flax, properties, validation, gradient fidelity, demo, benchmarks
#   bash .device/run40_suite_on_gpu.sh 3   # the GPU tests not run on run 39's tree: torch, attention_triton
#   bash .device/run40_suite_on_gpu.sh 4   # test_numerics_modes.py alone: on XLA:GPU it compiles slowly (run 39c:
#                                          # 14 tests in about 430 s)
# Run 39 (docs/logs/run39c_suite.log) already ran test_numerics_modes_triton.py (13 passed) and test_nan.py (26).
source .device/setup.sh
case $1 in
  1) FILES="tests/test_attention_reference.py tests/test_nvfp4.py" ;;
  2) FILES="tests/test_flax.py tests/test_properties.py tests/test_validation.py tests/test_grad_fidelity.py
            tests/test_train_lm.py tests/test_bench_numerics.py tests/test_shard_map_xla.py" ;;
  3) FILES="tests/test_torch.py tests/test_attention_triton.py" ;;
  4) FILES="tests/test_numerics_modes.py" ;;
esac
for f in $FILES; do
  left=$((570 - SECONDS)); [ $left -lt 20 ] && { echo "$f: not reached" >> $OUT/suite_$1.log; continue; }
  timeout $left python3 -m pytest -q -p no:cacheprovider -rf $f > $OUT/$(basename $f .py).log 2>&1
  echo "$f: $(tail -1 $OUT/$(basename $f .py).log)" >> $OUT/suite_$1.log
done
cat $OUT/suite_$1.log
