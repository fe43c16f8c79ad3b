#!/usr/bin/env bash
# Run 37b: where the gaps are (timelines), and the dQ launch config for short walks.
source .device/setup.sh
for c in 4096:causal 16384:window1024; do
  timeout 100 python3 docs/logs/run37_timeline.py ${c%%:*} ${c##*:} 2>&1 | grep -v -i warn > $OUT/B_timeline_${c##*:}_${c%%:*}.log
done
timeout 430 python3 docs/logs/run37_configs.py bwd 4096:causal,16384:window1024,16384:causal,4096:full default dq_block_m=64,dq_num_warps=4,dq_num_stages=2 dq_block_m=64,dq_block_n=32,dq_num_warps=4,dq_num_stages=3 2>&1 | grep -v -i warn | tee $OUT/B_dq_configs.log
