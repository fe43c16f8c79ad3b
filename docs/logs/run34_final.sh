#!/usr/bin/env bash
# N: HEAD vs this tree (dK/dV: 64 keys x 4 warps at D=128; unmasked query tiles load without row masks):
# bits of 10 cases, A/B on issue 13's shapes with cuDNN in the last pass, the mask benchmarks.
source .device/setup.sh 2>/dev/null
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && cp -r jqat kernels_triton ffi benchmarks /tmp/oldtree/
cp .device/headbwd/attention_bwd.py .device/headbwd/attention_common.py /tmp/oldtree/kernels_triton/
(PYTHONPATH=/tmp/site:/tmp/oldtree timeout 100 python3 .device/bits_hash.py /tmp/h_old.json; timeout 100 python3 .device/bits_hash.py /tmp/h_new.json) 2>&1 | grep -v Warn > /tmp/bits.log
python3 -c "
import json; a=json.load(open('/tmp/h_old.json')); b=json.load(open('/tmp/h_new.json'))
for k in a: print(k, 'SAME' if a[k]==b.get(k) else 'DIFF', a[k], b.get(k))
" 2>&1 | tee $OUT/N_bits.log
AB="benchmarks/ab_attention.py --iters 10 --repeats 5 --shapes 0,1,2,4,5,6,7"
for t in new old newc; do
  if [ $t = old ]; then P=/tmp/site:/tmp/oldtree; S=/tmp/oldtree/$AB; X=; else P=/tmp/site:$PWD; S=$AB; X=; fi
  if [ $t = newc ]; then X=--cudnn; fi
  PYTHONPATH=$P timeout 130 python3 $S $X --out $OUT/N_ab_$t.json 2>&1 | grep -v Warn | sed "s/^/$t /" >> $OUT/N_ab.log
done
cut -c1-200 $OUT/N_ab.log | tail -7
timeout 90 python3 benchmarks/masks.py --out $OUT/N_masks.json 2>&1 | grep -v Warn | tail -4 | tee $OUT/N_masks.log
