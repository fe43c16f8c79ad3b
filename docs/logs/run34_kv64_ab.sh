#!/usr/bin/env bash
# M: the D=128 dK/dV launch config, default (128 keys x 32 queries, 8 warps) vs 64 keys, 4 warps, 3 stages: A/B.
source .device/setup.sh 2>/dev/null
AB="benchmarks/ab_attention.py --iters 10 --repeats 5 --shapes 0,1,4,5,6,7"
for t in A B A B; do
  if [ $t = B ]; then export JQAT_ATTN_BWD_CONFIG=kv_block_n=64,kv_num_warps=4,kv_num_stages=3; else unset JQAT_ATTN_BWD_CONFIG; fi
  timeout 120 python3 $AB --out /tmp/ab_$t.json 2>&1 | grep -v Warn | sed "s/^/$t /" >> $OUT/M_ab.log
done
unset JQAT_ATTN_BWD_CONFIG
timeout 60 python3 benchmarks/masks.py --cases window --out $OUT/M_window_A.json 2>&1 | grep -v Warn | tail -3 > $OUT/M_window.log
JQAT_ATTN_BWD_CONFIG=kv_block_n=64,kv_num_warps=4,kv_num_stages=3 timeout 60 python3 benchmarks/masks.py --cases window --out $OUT/M_window_B.json 2>&1 | grep -v Warn | tail -3 >> $OUT/M_window.log
cat $OUT/M_window.log
