#!/usr/bin/env bash
# Run 37a: forward block_m=128 on the current kernel, 16k and 4k.
source .device/setup.sh
for S in 16384 4096; do
  timeout 250 python3 docs/logs/run37_fwd_blockm.py $S default block_m=128,num_warps=8,num_stages=3 block_m=128,num_warps=8,num_stages=2 2>&1 | grep -v -i warn | tee $OUT/A_blockm_$S.log
done
