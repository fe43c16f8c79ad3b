#!/usr/bin/env bash
# Run 40f: the final tree (the VJP keeps fq(K), fq(V) only; fq(Q) over O' again): the memory bound, bits, the
# touched GPU tests, then benchmarks/masks.py (time-boxed).
source .device/setup.sh
timeout 60 python3 benchmarks/attention.py --memory-only --out $OUT/F_memory.json 2>&1 | grep -v -i warn > $OUT/F_memory.log
grep -i "measured peak" $OUT/F_memory.log
timeout 60 python3 docs/logs/run35_bits_hash.py $OUT/F_bits.json causal,window_lens,segments_causal_lens,row > /dev/null 2>&1
echo "bits elapsed $SECONDS s"
timeout 110 python3 -m pytest -q -p no:cacheprovider -rf tests/test_callback_launch.py tests/test_plan.py \
  tests/test_attention_triton.py -k "callback or plan or vmap or jit or determin" > $OUT/F_tests.log 2>&1
tail -1 $OUT/F_tests.log; echo "tests elapsed $SECONDS s"
timeout $((245 - SECONDS)) python3 benchmarks/masks.py --cases window --out $OUT/F_masks.json 2>&1 | grep -v -i warn | tee $OUT/F_masks.log
echo "elapsed $SECONDS s"
