#!/usr/bin/env bash
source .device/setup.sh
timeout 120 python3 docs/logs/run35_fq_probe2.py 2>&1 | grep -v Warn | tee $OUT/C_fq_probe2.log
timeout 240 python3 -m pytest -q -x tests/test_attention_triton.py tests/test_nan.py tests/test_numerics_modes_triton.py 2>&1 | tail -4 | tee $OUT/C_gpu_tests.log
