source .device/setup.sh
# Run 43d: the GPU-marked suites that run 43c did not cover, on the committed tree (git archive 1cafc84), one time box.
t=final; rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t
(cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 540 python3 -m pytest -v -p no:cacheprovider -rfE -m gpu --durations=10 \
  tests/test_nan.py tests/test_numerics_modes_triton.py tests/test_callback_launch.py tests/test_nvfp4_triton.py \
  tests/test_grad_fidelity.py tests/test_ffi.py tests/test_flax.py tests/test_train_lm.py tests/test_bench_numerics.py \
  tests/test_validation.py tests/test_parallel.py tests/test_parallel_masks.py) > $OUT/D_gpu_tests.log 2>&1
echo "rc $?"; grep -c PASSED $OUT/D_gpu_tests.log; grep -E "FAILED|ERROR" $OUT/D_gpu_tests.log | head; tail -15 $OUT/D_gpu_tests.log
echo "elapsed $SECONDS s"
