#!/usr/bin/env bash
# Run 37c: heaviest-first program order for causal masks. A/B against main (timing, per kernel), then bits.
source .device/setup.sh
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && tar -xf .device/main.tar -C /tmp/oldtree
CASES=4096:causal,16384:causal,8192:gqa_causal,16384:window1024,16384:packed_causal1024,4096:full
for round in 1; do
  PYTHONPATH=/tmp/site:/tmp/oldtree timeout 170 python3 docs/logs/run37_configs.py fwd $CASES default 2>&1 | grep -v -i warn | sed 's/^/main /' | tee -a $OUT/C_ab.log
  timeout 170 python3 docs/logs/run37_configs.py fwd $CASES default 2>&1 | grep -v -i warn | sed 's/^/new  /' | tee -a $OUT/C_ab.log
done
B=causal,gqa_causal,d80_ragged,window_lens,segments_causal_lens,row
left=$((580 - SECONDS)); [ $left -gt 30 ] && timeout $((left / 2)) python3 docs/logs/run35_bits_hash.py /tmp/h_new.json $B > /dev/null 2>&1
left=$((580 - SECONDS)); [ $left -gt 30 ] && PYTHONPATH=/tmp/site:/tmp/oldtree timeout $left python3 docs/logs/run35_bits_hash.py /tmp/h_old.json $B > /dev/null 2>&1
python3 -c "
import json; a=json.load(open('/tmp/h_old.json')); b=json.load(open('/tmp/h_new.json'))
for k in a: print(k, 'SAME' if a[k]==b.get(k) else 'DIFF', a[k])
" 2>&1 | tee $OUT/C_bits.log
