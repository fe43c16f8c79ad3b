#!/usr/bin/env bash
# Run 40b (the checkout: even + hats + masks.py's given-dO column): launch configurations of the window's kernels
# now that none is serialized (run 37 tried some while dQ was), then benchmarks/masks.py.
source .device/setup.sh
W=16384:window1024
timeout 220 python3 docs/logs/run37_configs.py bwd $W default dq_block_m=64,dq_num_warps=4 \
  dq_block_m=64,dq_num_warps=4,dq_num_stages=2 dq_block_n=32 kv_block_m=64 kv_block_m=16 dq_num_stages=2 2>&1 \
  | grep -v -i warn | tee $OUT/B_bwd.log
timeout 100 python3 docs/logs/run37_configs.py fwd $W num_stages=2 num_stages=4 2>&1 | grep -v -i warn | tee $OUT/B_fwd.log
echo "configs elapsed $SECONDS s"
timeout $((560 - SECONDS)) python3 benchmarks/masks.py --out $OUT/B_masks.json 2>&1 | grep -v -i warn | tee $OUT/B_masks.log
echo "elapsed $SECONDS s"
