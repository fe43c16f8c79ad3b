source .device/setup.sh
# Run 41d: the GPU-marked suites that run 41c's time box did not reach (same tree).
timeout 400 python3 -m pytest -v -p no:cacheprovider -rfE -m gpu --durations=10 \
  tests/test_numerics_modes_triton.py tests/test_torch.py tests/test_callback_launch.py tests/test_nvfp4_triton.py \
  tests/test_grad_fidelity.py tests/test_ffi.py tests/test_bench_numerics.py tests/test_qat_matmul.py \
  tests/test_nvfp4_pallas.py tests/test_rope_qdq.py tests/test_parallel.py tests/test_parallel_masks.py \
  > $OUT/D_gpu_tests.log 2>&1
echo "rc $?"; grep -c PASSED $OUT/D_gpu_tests.log; grep -c -E "FAILED|ERROR" $OUT/D_gpu_tests.log; tail -8 $OUT/D_gpu_tests.log
echo "elapsed $SECONDS s"
