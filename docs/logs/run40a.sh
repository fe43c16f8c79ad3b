#!/usr/bin/env bash
# Run 40a: the quantize pass without bounds masks (even: run 39's patch, committed) and the custom VJP keeping the
# forward's fq(Q), fq(K), fq(V) as residuals (hats: even + that change, the checkout itself), each against main
# (18df57e); the device timeline of the window's calls; bits; the GPU tests these changes touch.
# Trees built here: git archive 18df57e / HEAD (even) ... > .device/{main,even}.tar; tar of the working tree > hats.tar.
source .device/setup.sh
for t in main even hats; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
ab() {  # tree cases
  left=$((300 - SECONDS)); [ $left -lt 20 ] && { echo "$1 skipped" | tee -a $OUT/A_ab.log; return; }
  PYTHONPATH=/tmp/site:/tmp/$1 timeout $left python3 docs/logs/run37_configs.py fwd $2 default 2>&1 | grep -v -i warn | sed "s/^/$1 /" | tee -a $OUT/A_ab.log
}
C=16384:window1024,4096:causal,4096:full,16384:full
ab main $C
ab even $C
ab hats $C
ab main 16384:window1024,4096:causal
echo "ab elapsed $SECONDS s" | tee -a $OUT/A_ab.log
for t in main hats; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 60 python3 docs/logs/run40_timeline.py 16384:window1024 2>&1 | grep -v -i warn | sed "s/^/$t /" >> $OUT/A_timeline.log
done
echo "timeline elapsed $SECONDS s" | tee -a $OUT/A_timeline.log
B=causal,window_lens,segments,segments_causal_lens,d80_ragged,row,tensor
for t in main hats; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 90 python3 docs/logs/run35_bits_hash.py /tmp/h_$t.json $B > /dev/null 2>&1
done
python3 -c "
import json
a, b = json.load(open('/tmp/h_main.json')), json.load(open('/tmp/h_hats.json'))
for k in b: print(k, 'SAME' if a.get(k) == b[k] else 'DIFF', b[k])
" 2>&1 | tee -a $OUT/A_bits.log
echo "bits elapsed $SECONDS s" | tee -a $OUT/A_bits.log
timeout $((575 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_nvfp4_triton.py tests/test_plan.py \
  tests/test_callback_launch.py tests/test_attention_triton.py -k "nan_block or plan or callback or vmap or determin or jit" > $OUT/A_tests.log 2>&1
tail -3 $OUT/A_tests.log; echo "elapsed $SECONDS s"
