#!/usr/bin/env bash
# Run 36e: the final tree. Bits against main (6682073), issue 13's shapes with cuDNN, masks, then GPU tests.
source .device/setup.sh
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && tar -xf .device/main.tar -C /tmp/oldtree
(PYTHONPATH=/tmp/site:/tmp/oldtree timeout 75 python3 docs/logs/run35_bits_hash.py /tmp/h_old.json; timeout 75 python3 docs/logs/run35_bits_hash.py /tmp/h_new.json) > /dev/null 2>&1
python3 -c "
import json; a=json.load(open('/tmp/h_old.json')); b=json.load(open('/tmp/h_new.json'))
for k in a: print(k, 'SAME' if a[k]==b.get(k) else 'DIFF')
" > $OUT/E_bits.log 2>&1
cat $OUT/E_bits.log
timeout 150 python3 benchmarks/ab_attention.py --iters 10 --repeats 5 --shapes 0,1,2,4,5,6,7 --cudnn --out $OUT/E_ab.json 2>&1 | grep -v -i warn > $OUT/E_ab.log
cat $OUT/E_ab.log
timeout 80 python3 benchmarks/masks.py --out $OUT/E_masks.json 2>&1 | grep -v -i warn | tail -5 > $OUT/E_masks.log
cat $OUT/E_masks.log
for f in test_plan test_nvfp4_triton test_masks test_attention_triton test_numerics_modes_triton test_nan; do
  left=$((540 - SECONDS)); [ $left -lt 20 ] && break
  echo "$f: $(timeout $left python3 -m pytest -q -p no:cacheprovider tests/$f.py 2>&1 | tail -1)" >> $OUT/E_gpu_tests.log
done
cat $OUT/E_gpu_tests.log
