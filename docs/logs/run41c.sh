source .device/setup.sh
# Run 41c: the GPU-marked suites on main's tree (1f48322 + docs), the full test_attention_triton.py first (not run to
# its end on the final tree of run 40), then the rest, in one time-boxed pytest call.
timeout 560 python3 -m pytest -v -p no:cacheprovider -rfE -m gpu --durations=10 \
  tests/test_attention_triton.py tests/test_nan.py tests/test_masks.py tests/test_numerics_modes_triton.py \
  tests/test_torch.py tests/test_callback_launch.py tests/test_nvfp4_triton.py tests/test_parallel.py \
  tests/test_parallel_masks.py tests/test_grad_fidelity.py tests/test_ffi.py tests/test_bench_numerics.py \
  tests/test_qat_matmul.py tests/test_nvfp4_pallas.py tests/test_rope_qdq.py > $OUT/C_gpu_tests.log 2>&1
echo "rc $?"; grep -c PASSED $OUT/C_gpu_tests.log; grep -c -E "FAILED|ERROR" $OUT/C_gpu_tests.log; tail -25 $OUT/C_gpu_tests.log
echo "elapsed $SECONDS s"
