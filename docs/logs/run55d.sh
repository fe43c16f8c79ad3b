# Run 55d (session 23): the GPU mask tests of tests/test_attention_triton.py that run 55b's time box cut, on 3ede5c3.
# Carry .device. Writes 1 file.
source .device/setup.sh
timeout 200 python3 -m pytest -q -rs -m gpu tests/test_attention_triton.py -k "48-all or 96-lengths or masks_under_vmap" \
  > $OUT/run55d_tests.log 2>&1; tail -2 $OUT/run55d_tests.log; echo "elapsed $SECONDS s"
