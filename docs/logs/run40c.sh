#!/usr/bin/env bash
# Run 40c (the checkout: even + hats + the window's dQ configuration): whether dQ at 64 rows / 4 warps / 2 stages
# helps beyond windows; bits; benchmarks/masks.py; GPU tests of masks and numerics modes.
source .device/setup.sh
timeout 170 python3 docs/logs/run37_configs.py bwd 4096:causal,16384:causal,4096:full,8192:gqa_causal,16384:window1024 \
  default dq_block_m=64,dq_num_warps=4,dq_num_stages=2 2>&1 | grep -v -i warn | tee $OUT/C_bwd.log
echo "configs elapsed $SECONDS s"
timeout 80 python3 docs/logs/run35_bits_hash.py $OUT/C_bits.json causal,window_lens,segments,segments_causal_lens,d80_ragged,row,tensor > /dev/null 2>&1
echo "bits elapsed $SECONDS s"
timeout 90 python3 benchmarks/masks.py --out $OUT/C_masks.json 2>&1 | grep -v -i warn | tee $OUT/C_masks.log
echo "masks elapsed $SECONDS s"
timeout $((575 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_masks.py tests/test_numerics_modes_triton.py > $OUT/C_tests.log 2>&1
tail -3 $OUT/C_tests.log; echo "elapsed $SECONDS s"
