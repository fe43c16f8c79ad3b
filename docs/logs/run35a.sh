#!/usr/bin/env bash
# Run 35a: packed documents keep interior tiles unmasked. GPU tests, bits vs main, masks A/B, kernel times.
source .device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > $OUT/gpu.txt
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && cp -r jqat kernels_triton ffi benchmarks /tmp/oldtree/
cp .device/mainkern/*.py /tmp/oldtree/kernels_triton/
timeout 200 python3 -m pytest -q -x tests/test_tile_ranges.py tests/test_masks.py 2>&1 | tail -5 > $OUT/A_gpu_tests.log
(PYTHONPATH=/tmp/site:/tmp/oldtree timeout 120 python3 docs/logs/run35_bits_hash.py /tmp/h_old.json; timeout 120 python3 docs/logs/run35_bits_hash.py /tmp/h_new.json) 2>&1 | grep -v Warn > $OUT/A_bits_raw.log
python3 -c "
import json; a=json.load(open('/tmp/h_old.json')); b=json.load(open('/tmp/h_new.json'))
for k in a: print(k, 'SAME' if a[k]==b.get(k) else 'DIFF', a[k], b.get(k))
" > $OUT/A_bits.log 2>&1
for t in new old; do
  if [ $t = old ]; then P=/tmp/site:/tmp/oldtree; S=/tmp/oldtree/benchmarks/masks.py; else P=/tmp/site:$PWD; S=benchmarks/masks.py; fi
  PYTHONPATH=$P timeout 100 python3 $S --cases packed --out $OUT/A_masks_$t.json 2>&1 | grep -v Warn | tail -3 | sed "s/^/$t /" >> $OUT/A_masks.log
done
timeout 150 python3 benchmarks/kernel_times.py --out $OUT/A_kernel_times.json --cases full,causal,window:128,window:256,window:512,window:1024,window:2048,window:4096,packed:1024,packed_causal:1024 2>&1 | grep -v Warn > $OUT/A_kernel_times.log
cat $OUT/A_gpu_tests.log $OUT/A_bits.log $OUT/A_masks.log $OUT/A_kernel_times.log
