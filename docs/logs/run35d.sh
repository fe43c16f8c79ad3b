#!/usr/bin/env bash
# Run 35d: fq_tile chooses the NaN block's bits as integers. Probe, nvfp4 GPU tests, bits of the 11 cases.
source .device/setup.sh
timeout 60 python3 docs/logs/run35_fq_probe2.py 2>&1 | grep -v Warn | grep "^new" > $OUT/D_fq_probe2.log
timeout 150 python3 -m pytest -q tests/test_nvfp4_triton.py 2>&1 | tail -2 > $OUT/D_gpu_tests.log
timeout 120 python3 docs/logs/run35_bits_hash.py $OUT/D_bits_new.json > /dev/null 2>&1
cat $OUT/D_fq_probe2.log $OUT/D_gpu_tests.log; cat $OUT/D_bits_new.json | tr -d '\n ' | cut -c1-3000
