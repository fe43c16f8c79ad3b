# Run 55b (session 23): GPU tests of the cast_fq change (run 55a ran the quantizer's oracle tests marked gpu and
# 15 attention tests before its time box). Carry .device. Writes 1 file.
source .device/setup.sh
timeout 120 python3 -m pytest -q -rs tests/test_nvfp4_triton.py -k "not gpu" > $OUT/run55b_tests.log 2>&1
tail -2 $OUT/run55b_tests.log; echo "elapsed $SECONDS s"
timeout 150 python3 -m pytest -q -rs -m gpu tests/test_attention_triton.py -k "D32 or D16 or masks" \
  >> $OUT/run55b_tests.log 2>&1; tail -2 $OUT/run55b_tests.log; echo "elapsed $SECONDS s"
timeout 150 python3 -m pytest -q -rs -m gpu tests/test_numerics_modes_triton.py tests/test_callback_launch.py \
  tests/test_torch.py -k "tensor or row or primal or no_grad" >> $OUT/run55b_tests.log 2>&1
tail -2 $OUT/run55b_tests.log; echo "elapsed $SECONDS s"
