#!/usr/bin/env bash
# Run 38d: where the tensor-mode Inf case differs on the GPU; GPU tests for head dims > 128 and masks (time-boxed).
source .device/setup.sh
timeout 90 python3 docs/logs/run38_tensor_inf_debug.py $OUT/D_tensor_inf.npz 2>&1 | grep -v -i warn > $OUT/D_tensor_inf.log
cat $OUT/D_tensor_inf.log
timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_triton.py -k "masks or D192 or D256" > $OUT/D_gpu_tests.log 2>&1
tail -3 $OUT/D_gpu_tests.log
