source .device/setup.sh
# Run 43c: the kept tree (run42_qpass_nomask + run42_rope_rcp): issue 13's table against cuDNN in one process, the
# masks benchmark, then GPU tests as time allows.
t=kept; rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t
(cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 240 python3 benchmarks/ab_attention.py --iters 10 \
  --repeats 5 --cudnn --out $OUT/C_ab.json 2>&1 | grep -v -i warn) > $OUT/C_ab.log; cat $OUT/C_ab.log
echo "elapsed $SECONDS s"
(cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 benchmarks/masks.py --out $OUT/C_masks.json \
  2>&1 | grep -v -i warn) > $OUT/C_masks.log; tail -8 $OUT/C_masks.log
echo "elapsed $SECONDS s"
(cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout $((585 - SECONDS)) python3 -m pytest -v -p no:cacheprovider \
  -rfE -m gpu tests/test_plan.py tests/test_torch.py tests/test_attention_triton.py tests/test_masks.py) > $OUT/C_tests.log 2>&1
grep -c PASSED $OUT/C_tests.log; grep -E "FAILED|ERROR" $OUT/C_tests.log | head -5; tail -2 $OUT/C_tests.log
echo "elapsed $SECONDS s"
