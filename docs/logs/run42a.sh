source .device/setup.sh
# Run 42a: the fidelity GPU test after the SmoothK-key fix, then the GPU files run 41 did not reach.
timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE -m gpu --tb=long tests/test_grad_fidelity.py > $OUT/A_fidelity.log 2>&1
echo "fidelity rc $?"; tail -40 $OUT/A_fidelity.log
timeout 300 python3 -m pytest -v -p no:cacheprovider -rfE -m gpu --durations=10 \
  tests/test_nvfp4_pallas.py tests/test_rope_qdq.py tests/test_qat_matmul.py > $OUT/A_rest.log 2>&1
echo "rest rc $?"; grep -c PASSED $OUT/A_rest.log; grep -E "FAILED|ERROR" $OUT/A_rest.log | head; tail -5 $OUT/A_rest.log
echo "elapsed $SECONDS s"
