#!/usr/bin/env bash
# Run 39a: one pipelined walk for windowed programs (window_single_walk), the same for causal
# (single_walk_causal), fq(Q) from the pass for packed documents (segments_qpass), each against main; then bits.
source .device/setup.sh
for t in main window_single_walk single_walk_causal segments_qpass both; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
ab() {  # tree cases
  left=$((330 - SECONDS)); [ $left -lt 20 ] && { echo "$1 skipped" | tee -a $OUT/A_ab.log; return; }
  PYTHONPATH=/tmp/site:/tmp/$1 timeout $left python3 docs/logs/run37_configs.py fwd $2 default 2>&1 | grep -v -i warn | sed "s/^/$1 /" | tee -a $OUT/A_ab.log
}
ab main 16384:window1024,16384:packed1024,16384:packed_causal1024,4096:causal,16384:causal,8192:gqa_causal
ab window_single_walk 16384:window1024
ab segments_qpass 16384:packed1024,16384:packed_causal1024
ab single_walk_causal 16384:window1024,4096:causal,16384:causal,8192:gqa_causal
ab main 16384:window1024,16384:packed1024
echo "ab elapsed $SECONDS s" | tee -a $OUT/A_ab.log
bits() {  # tree cases
  left=$((560 - SECONDS)); [ $left -lt 20 ] && { echo "$1 bits skipped" | tee -a $OUT/A_bits.log; return; }
  PYTHONPATH=/tmp/site:/tmp/$1 timeout $left python3 docs/logs/run35_bits_hash.py /tmp/h_$1.json $2 > /dev/null 2>&1
}
B=window_lens,segments,segments_causal_lens,causal
bits main $B,gqa_causal,row
bits both $B
bits single_walk_causal causal,gqa_causal,window_lens,row
python3 -c "
import json, os
a = json.load(open('/tmp/h_main.json'))
for t in ('both', 'single_walk_causal'):
  if not os.path.exists(f'/tmp/h_{t}.json'): print(t, 'missing'); continue
  b = json.load(open(f'/tmp/h_{t}.json'))
  for k in b: print(t, k, 'SAME' if a.get(k) == b[k] else 'DIFF', b[k])
" 2>&1 | tee -a $OUT/A_bits.log
echo "elapsed $SECONDS s" | tee -a $OUT/A_bits.log
