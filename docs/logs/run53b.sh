# Run 53b (session 22). Carry .device. Writes 6 files.
# (1) docs/logs/run53_pass_probe.py: one quantize launch over Q, K, V against three (and a copy's).
# (2) the new D <= 64 defaults (fq(Q) from the pass at 32 < D <= 64, O alone capped at 128 registers):
#     docs/logs/run51_d64.py default, then the GPU tests of the D <= 64 cases.
source .device/setup.sh
timeout 90 python3 docs/logs/run53_pass_probe.py $OUT/run53b_probe.json 2>&1 | grep -v -i warn > $OUT/run53b_probe.log
echo "probe elapsed $SECONDS s"
timeout 100 python3 docs/logs/run51_d64.py $OUT/run53b_d64.json default > /dev/null 2>&1; echo "d64 elapsed $SECONDS s"
timeout $((560 - SECONDS)) python3 -m pytest -q -rs -m gpu tests/test_callback_launch.py tests/test_plan.py \
  tests/test_attention_triton.py tests/test_masks.py tests/test_torch.py \
  -k "primal or four or D64 or -64- or -48- or -32- or d64 or d32 or torch or plan" > $OUT/run53b_tests.log 2>&1
tail -3 $OUT/run53b_tests.log; echo "elapsed $SECONDS s"
