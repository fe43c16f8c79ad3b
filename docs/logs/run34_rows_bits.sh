#!/usr/bin/env bash
# L1: the row-oriented dK/dV kernel: bitwise old vs new, GPU tests, launch-config sweep.
source .device/setup.sh 2>/dev/null
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && cp -r jqat kernels_triton ffi benchmarks /tmp/oldtree/ 2>/dev/null
cp .device/oldbwd/attention_bwd.py /tmp/oldtree/kernels_triton/attention_bwd.py; cp .device/oldbwd/nvfp4.py /tmp/oldtree/kernels_triton/nvfp4.py
ls -la jqat/ | head -5 > $OUT/L1_tree.log
(PYTHONPATH=/tmp/site:/tmp/oldtree timeout 150 python3 .device/bits_hash.py /tmp/h_old.json; timeout 150 python3 .device/bits_hash.py /tmp/h_new.json) 2>&1 | grep -v Warn > $OUT/L1_bits.log
python3 -c "
import json; a=json.load(open('/tmp/h_old.json')); b=json.load(open('/tmp/h_new.json'))
for k in a: print(k, 'SAME' if a[k]==b[k] else 'DIFF', {n:(a[k][n]==b[k][n]) for n in a[k]})
" 2>&1 | tee -a $OUT/L1_bits.log
timeout 330 python3 -m pytest -q -x tests/test_attention_triton.py tests/test_numerics_modes_triton.py tests/test_nvfp4_triton.py tests/test_nan.py tests/test_masks.py -p no:cacheprovider --durations=5 > $OUT/L1_tests.log 2>&1; echo "tests rc=$?" >> $OUT/L1_tests.log
tail -12 $OUT/L1_tests.log
