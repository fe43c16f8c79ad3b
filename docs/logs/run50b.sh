# Run 50b (session 20): (1) the primal forward kernel rounding its own Q at D <= 128 (tree "ownq":
# docs/logs/run50_ownq.patch, no Q in the fake-quantize pass) against the kept tree ("main", the Q pass where the
# residual forward takes it), alternated twice on issue 13's rows 0, 1, 2, 3, 6, 7; (2) the GPU tests that go through
# jqat.attention's primal, on the kept tree. Build the trees here first:
#   git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml docs/logs > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t \
#     && patch -d /tmp/t -p1 -s < docs/logs/run50_ownq.patch && tar -cf .device/ownq.tar -C /tmp/t .
source .device/setup.sh
for t in main ownq; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
for t in main ownq main ownq; do
  (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 90 python3 docs/logs/run50_primal.py primal $OUT/run50b_$t.json \
    0,1,2,3,6,7 2>&1 | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/run50b_ownq.log)
done
echo "elapsed $SECONDS s"
(cd /tmp/main && PYTHONPATH=/tmp/site:/tmp/main timeout $((290 - SECONDS)) python3 -m pytest -q -m gpu -x \
  tests/test_callback_launch.py tests/test_flax.py tests/test_masks.py tests/test_attention_triton.py \
  > $OUT/run50b_gpu_tests.log 2>&1)
tail -3 $OUT/run50b_gpu_tests.log; echo "elapsed $SECONDS s"
