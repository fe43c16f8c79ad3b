# Run 51a (prepared in session 20, not yet run): GPU checks of what session 20 landed without a device after it.
# (1) the primal and no-grad torch tests on the H200: tests/test_callback_launch.py's primal cases (the no-mask "block"
# case at D = 128 was added after run 50a) and tests/test_torch.py's no-grad cases (jqat::attention_out on CUDA: O
# bitwise the differentiable op's); (2) issue 12's masks benchmark (its forward column is now the primal); (3) the
# GPU suite files that run 50b's time box cut. Carry .device (setup.sh and the jax-triton wheel). Writes 4 files.
source .device/setup.sh
timeout 200 python3 -m pytest -q tests/test_callback_launch.py tests/test_torch.py -k "primal or no_grad or residuals" \
  > $OUT/run51a_tests.log 2>&1; tail -2 $OUT/run51a_tests.log; echo "elapsed $SECONDS s"
timeout 150 python3 benchmarks/masks.py --out $OUT/run51a_masks.json > $OUT/run51a_masks.log 2>&1
grep -v -i warn $OUT/run51a_masks.log | tail -6; echo "elapsed $SECONDS s"
timeout $((580 - SECONDS)) python3 -m pytest -q -m gpu tests/test_masks.py tests/test_attention_triton.py \
  tests/test_torch.py tests/test_numerics_modes_triton.py > $OUT/run51a_gpu_tests.log 2>&1
tail -3 $OUT/run51a_gpu_tests.log; echo "elapsed $SECONDS s"
