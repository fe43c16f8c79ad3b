#!/usr/bin/env bash
# Run 39b: the landed tree (window single walk, fq(Q) from the pass for packed documents, row_tile_visible):
# masks benchmark, bits against run 39a's hashes (docs/logs/run39a_bits.log), GPU mask tests (time-boxed).
source .device/setup.sh
timeout 110 python3 benchmarks/masks.py --out $OUT/B_masks.json 2>&1 | grep -v -i warn | tail -5 > $OUT/B_masks.log
cat $OUT/B_masks.log
timeout 90 python3 docs/logs/run35_bits_hash.py /tmp/h.json causal,segments,segments_causal_lens,window_lens,gqa_causal \
  > /dev/null 2>&1; cat /tmp/h.json | tee $OUT/B_bits.json; echo
for f in "tests/test_masks.py" "tests/test_attention_triton.py -m gpu -k masks" "tests/test_numerics_modes_triton.py"; do
  left=$((575 - SECONDS)); [ $left -lt 30 ] && { echo "$f: not reached" >> $OUT/B_gpu_tests.log; continue; }
  timeout $left python3 -m pytest -q -p no:cacheprovider -rf $f > $OUT/B_$(echo $f | tr ' /' '__').log 2>&1
  echo "$f: $(tail -1 $OUT/B_$(echo $f | tr ' /' '__').log)" >> $OUT/B_gpu_tests.log
done
cat $OUT/B_gpu_tests.log; echo "elapsed $SECONDS s"
