source .device/setup.sh
# Run 42d: the kept tree (E2M1 quotient rounding only): bits of run42's extra cases against main, issue 13's table
# against cuDNN, the masks benchmark, then GPU tests as time allows.
for t in main final; do rm -rf /tmp/t_$t && mkdir -p /tmp/t_$t && tar -xf .device/$t.tar -C /tmp/t_$t; done
for t in main final; do
  PYTHONPATH=/tmp/site:/tmp/t_$t timeout 60 python3 docs/logs/run42_bits_hash.py $OUT/D_h42_$t.json > $OUT/D_h42_$t.log 2>&1
done
python3 -c "
import json
a, b = json.load(open('$OUT/D_h42_main.json')), json.load(open('$OUT/D_h42_final.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/D_bits.log
(cd /tmp/t_final && PYTHONPATH=/tmp/site:/tmp/t_final timeout 230 python3 benchmarks/ab_attention.py --iters 10 \
  --repeats 5 --cudnn --out $OUT/D_ab.json 2>&1 | grep -v -i warn) > $OUT/D_ab.log; cat $OUT/D_ab.log
(cd /tmp/t_final && PYTHONPATH=/tmp/site:/tmp/t_final timeout 120 python3 benchmarks/masks.py --out $OUT/D_masks.json \
  2>&1 | grep -v -i warn) > $OUT/D_masks.log; tail -12 $OUT/D_masks.log
echo "elapsed $SECONDS s"
(cd /tmp/t_final && PYTHONPATH=/tmp/site:/tmp/t_final timeout $((565 - SECONDS)) python3 -m pytest -v -p no:cacheprovider \
  -rfE -m gpu tests/test_masks.py tests/test_nan.py tests/test_numerics_modes_triton.py) > $OUT/D_tests.log 2>&1
grep -c PASSED $OUT/D_tests.log; grep -E "FAILED|ERROR" $OUT/D_tests.log | head -5; tail -2 $OUT/D_tests.log
echo "elapsed $SECONDS s"
