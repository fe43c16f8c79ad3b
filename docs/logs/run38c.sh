#!/usr/bin/env bash
# Run 38c: the failing tensor-mode NaN test in both trees (traceback); GPU tests for head dims > 128 and masks;
# the masks benchmark on main (A/B for the packed rows).
source .device/setup.sh
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && tar -xf .device/main.tar -C /tmp/oldtree && cp -r tests /tmp/oldtree/
timeout 90 python3 -m pytest -q -p no:cacheprovider -x --tb=long tests/test_numerics_modes_triton.py -k nan_and_inf > $OUT/C_nan_new.log 2>&1
(cd /tmp/oldtree && PYTHONPATH=/tmp/site:/tmp/oldtree timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_numerics_modes_triton.py -k nan_and_inf > $OUT/C_nan_main.log 2>&1)
tail -3 $OUT/C_nan_new.log $OUT/C_nan_main.log
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_triton.py -k "masks or D192 or D256" 2>&1 | tail -3 > $OUT/C_gpu_tests.log
cat $OUT/C_gpu_tests.log
left=$((570 - SECONDS)); [ $left -gt 30 ] && PYTHONPATH=/tmp/site:/tmp/oldtree timeout $left python3 benchmarks/masks.py --out $OUT/C_masks_main.json 2>&1 | grep -v -i warn | tail -5 > $OUT/C_masks_main.log
cat $OUT/C_masks_main.log
