# Run 46c: the kept tree (the forward's K/V by TMA where D_PAD >= 64: Triton 3.6's ptxas died on D = 16 and 32 in
# run 46b's torch.compile tests): the GPU tests 46b failed or did not reach (three pytest processes side by side,
# each with its own caches), then the rows of issue 13's table that 46b's time box cut (5-7; rows 0-4 are 46b's,
# whose D = 64 and D = 128 kernels this tree builds unchanged).
source .device/setup.sh
t() {
  name=$1; shift
  (TRITON_CACHE_DIR=/tmp/tc-$name JQAT_CACHE_DIR=/tmp/jc-$name timeout 200 python3 -m pytest -q -p no:cacheprovider \
     -m gpu "$@" > $OUT/run46c_tests_$name.log 2>&1; echo "rc $? elapsed $SECONDS s" >> $OUT/run46c_tests_$name.log) &
}
t attn tests/test_attention_triton.py -k masks
t torch tests/test_torch.py
t callback tests/test_callback_launch.py tests/test_nan.py
wait
for f in $OUT/run46c_tests_*.log; do echo "== $f"; tail -4 $f; done
timeout $((440 - SECONDS)) python3 benchmarks/attention.py --rows 5,6,7 --fastvideo-shapes none --iters 10 \
  --repeats 5 --out $OUT/run46c_attention.json > $OUT/run46c_attention.log 2>&1
echo "rc $? elapsed $SECONDS s" >> $OUT/run46c_attention.log
grep -v -i warn $OUT/run46c_attention.log | tail -12
