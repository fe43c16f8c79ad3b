#!/usr/bin/env bash
# Run 38f: the reference's exact division (div_rn) on the GPU: its own test, the tensor-mode tests (time-boxed).
source .device/setup.sh
timeout 90 python3 docs/logs/run38_tensor_ref_gpu.py 2>&1 | grep -v -i warn > $OUT/F_tensor_ref_gpu.log
cut -c1-200 $OUT/F_tensor_ref_gpu.log
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_numerics_modes.py -k "div_rn or tensor" 2>&1 | tail -2 > $OUT/F_numerics_modes.log
cat $OUT/F_numerics_modes.log
left=$((330 - SECONDS)); timeout $left python3 -m pytest -q -p no:cacheprovider tests/test_numerics_modes_triton.py 2>&1 | tail -3 > $OUT/F_numerics_modes_triton.log
cat $OUT/F_numerics_modes_triton.log
