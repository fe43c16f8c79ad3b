#!/usr/bin/env bash
# Run 38a: the window loop fix (unserialized wgmma) and fq(Q) from the pass at D > 128. A/B against main, then bits.
source .device/setup.sh
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && tar -xf .device/main.tar -C /tmp/oldtree
cp docs/logs/run37_configs.py /tmp/run37_configs.py
CASES=16384:window1024,4096:full_d256,8192:full_d256,4096:full_d192
PYTHONPATH=/tmp/site:/tmp/oldtree timeout 170 python3 docs/logs/run37_configs.py fwd $CASES default 2>&1 | grep -v -i warn | sed 's/^/main /' | tee -a $OUT/A_ab.log
timeout 170 python3 docs/logs/run37_configs.py fwd $CASES default 2>&1 | grep -v -i warn | sed 's/^/new  /' | tee -a $OUT/A_ab.log
B=window_lens,segments_causal_lens,d256,causal
left=$((560 - SECONDS)); [ $left -gt 30 ] && timeout $((left / 2)) python3 docs/logs/run35_bits_hash.py /tmp/h_new.json $B > /dev/null 2>&1
left=$((560 - SECONDS)); [ $left -gt 30 ] && PYTHONPATH=/tmp/site:/tmp/oldtree timeout $left python3 docs/logs/run35_bits_hash.py /tmp/h_old.json $B > /dev/null 2>&1
python3 -c "
import json; a=json.load(open('/tmp/h_old.json')); b=json.load(open('/tmp/h_new.json'))
for k in a: print(k, 'SAME' if a[k]==b.get(k) else 'DIFF', a[k])
" 2>&1 | tee $OUT/A_bits.log
echo "elapsed $SECONDS s" | tee -a $OUT/A_bits.log
