#!/usr/bin/env bash
# Run 35b: span masks (fwd, dQ), k-ary segment search, fq_tile one reduction. GPU tests, bits vs main, A/B.
source .device/setup.sh
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && cp -r jqat kernels_triton ffi benchmarks /tmp/oldtree/
cp .device/mainkern/*.py /tmp/oldtree/kernels_triton/
timeout 240 python3 -m pytest -q -x tests/test_tile_ranges.py tests/test_masks.py tests/test_nvfp4_triton.py 2>&1 | tail -4 > $OUT/B_gpu_tests.log
(PYTHONPATH=/tmp/site:/tmp/oldtree timeout 100 python3 docs/logs/run35_bits_hash.py /tmp/h_old.json; timeout 100 python3 docs/logs/run35_bits_hash.py /tmp/h_new.json) > /dev/null 2>&1
python3 -c "
import json; a=json.load(open('/tmp/h_old.json')); b=json.load(open('/tmp/h_new.json'))
for k in a: print(k, 'SAME' if a[k]==b.get(k) else 'DIFF', a[k], b.get(k))
" > $OUT/B_bits.log 2>&1
for t in new old; do
  if [ $t = old ]; then P=/tmp/site:/tmp/oldtree; S=/tmp/oldtree/benchmarks/masks.py; else P=/tmp/site:$PWD; S=benchmarks/masks.py; fi
  PYTHONPATH=$P timeout 100 python3 $S --out $OUT/B_masks_$t.json 2>&1 | grep -v Warn | grep -E "packed|window" | sed "s/^/$t /" >> $OUT/B_masks.log
done
AB="benchmarks/ab_attention.py --iters 10 --repeats 5 --shapes 1,5"
for t in new old; do
  if [ $t = old ]; then P=/tmp/site:/tmp/oldtree; S=/tmp/oldtree/$AB; else P=/tmp/site:$PWD; S=$AB; fi
  PYTHONPATH=$P timeout 100 python3 $S --out $OUT/B_ab_$t.json 2>&1 | grep -v Warn | sed "s/^/$t /" >> $OUT/B_ab.log
done
timeout 60 python3 docs/logs/run35_fq_probe.py > $OUT/B_fq_probe.log 2>&1
timeout 120 python3 benchmarks/kernel_times.py --out $OUT/B_kernel_times.json --cases full,window:256,window:1024,window:4096,packed:1024,packed_causal:1024 2>&1 | grep -v Warn > $OUT/B_kernel_times.log
cat $OUT/B_gpu_tests.log $OUT/B_bits.log $OUT/B_masks.log $OUT/B_ab.log $OUT/B_fq_probe.log $OUT/B_kernel_times.log | cut -c1-250
