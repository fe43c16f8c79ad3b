# Run 50a (session 20): the forward without residuals (jqat.attention's primal). Tests of the new path on the GPU,
# the A/B against the residual forward and cuDNN on issue 13's shapes, a launch-config sweep of the new kernel, then
# benchmarks/attention.py on every row (its jqat fwd column is the primal). Writes 7 files.
source .device/setup.sh
timeout 200 python3 -m pytest -q tests/test_callback_launch.py tests/test_plan.py -k "primal or residual" \
  > $OUT/run50a_tests.log 2>&1; tail -2 $OUT/run50a_tests.log; echo "elapsed $SECONDS s"
timeout 150 python3 docs/logs/run50_primal.py ab $OUT/run50a_ab.json 2>&1 | grep -v -i warn | tee $OUT/run50a_ab.log
echo "elapsed $SECONDS s"
timeout 120 python3 docs/logs/run50_primal.py sweep $OUT/run50a_sweep.json default block_m=128,num_warps=8 \
  num_stages=2 num_stages=4 2>&1 | grep -v -i warn | tee $OUT/run50a_sweep.log
echo "elapsed $SECONDS s"
timeout $((560 - SECONDS)) python3 benchmarks/attention.py --fastvideo-shapes none --iters 10 --repeats 5 \
  --out $OUT/run50a_attention.json > $OUT/run50a_attention.log 2>&1
echo "rc $? elapsed $SECONDS s"; grep -v -i warn $OUT/run50a_attention.log | tail -20
