# Run 55c (session 23): more GPU tests on 3ede5c3 (cast_fq): NaN propagation, torch = JAX bit for bit, masks.
# Carry .device. Writes 1 file.
source .device/setup.sh
timeout 170 python3 -m pytest -q -rs -m gpu tests/test_nan.py > $OUT/run55c_tests.log 2>&1
tail -2 $OUT/run55c_tests.log; echo "elapsed $SECONDS s"
timeout 170 python3 -m pytest -q -rs -m gpu tests/test_torch.py >> $OUT/run55c_tests.log 2>&1
tail -2 $OUT/run55c_tests.log; echo "elapsed $SECONDS s"
timeout 100 python3 -m pytest -q -rs -m gpu tests/test_masks.py >> $OUT/run55c_tests.log 2>&1
tail -2 $OUT/run55c_tests.log; echo "elapsed $SECONDS s"
