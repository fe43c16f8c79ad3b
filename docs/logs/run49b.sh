# Run 49b (prepared in session 19, not yet run): the GPU tests that run 48a's time box cut (the last of
# tests/test_attention_triton.py's unmasked cases, and the RoPE / grad-fidelity / parallel files that session 19's
# run did not include; the two-GPU tests skip on one GPU), three pytest processes side by side.
source .device/setup.sh
t() {
  name=$1; shift
  (TRITON_CACHE_DIR=/tmp/tc-$name JQAT_CACHE_DIR=/tmp/jc-$name timeout 400 python3 -m pytest -q -p no:cacheprovider \
     -m gpu "$@" > $OUT/run49b_tests_$name.log 2>&1; echo "rc $? elapsed $SECONDS s" >> $OUT/run49b_tests_$name.log) &
}
t attn tests/test_attention_triton.py -k "deterministic or vmap_and_jit"
t rest tests/test_rope_qdq.py tests/test_nvfp4_triton.py tests/test_grad_fidelity.py tests/test_validation.py
t multi tests/test_parallel.py tests/test_parallel_masks.py tests/test_train_lm.py tests/test_bench_numerics.py
wait
for f in $OUT/run49b_tests_*.log; do echo "== $f"; tail -3 $f; done
