source .device/setup.sh
# Run 42b: the E2M1 quotient rounding and the forward's row max from raw scores: exhaustive checks, bits, quick A/B.
rm -rf /tmp/main && mkdir -p /tmp/main && tar -xf .device/main.tar -C /tmp/main
timeout 200 python3 -m pytest -v -p no:cacheprovider -rfE -m gpu tests/test_nvfp4_triton.py > $OUT/B_nvfp4.log 2>&1
echo "nvfp4 rc $?"; grep -E "passed|failed" $OUT/B_nvfp4.log | tail -2; grep -E "FAILED|Error" $OUT/B_nvfp4.log | head -5
for t in /tmp/main $PWD; do
  n=$(basename $t)
  PYTHONPATH=/tmp/site:$t timeout 100 python3 docs/logs/run35_bits_hash.py /tmp/h35_$n.json > /dev/null 2>&1
  PYTHONPATH=/tmp/site:$t timeout 60 python3 docs/logs/run42_bits_hash.py /tmp/h42_$n.json > /dev/null 2>&1
done
python3 -c "
import json, os
for s in ('35', '42'):
  a, b = json.load(open('/tmp/h%s_main.json' % s)), json.load(open('/tmp/h%s_%s.json' % (s, os.path.basename(os.getcwd()))))
  for k in a: print(k, {n: 'same' if a[k][n] == b.get(k, {}).get(n) else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/B_bits.log
cp /tmp/h35_*.json /tmp/h42_*.json $OUT/ 2>/dev/null
for t in /tmp/main $PWD /tmp/main $PWD; do
  PYTHONPATH=/tmp/site:$t timeout 90 python3 benchmarks/ab_attention.py --iters 10 --repeats 5 --shapes 0,1,4,5 \
    --out /tmp/ab.json 2>&1 | grep -v -i warn | sed "s|^|$(basename $t) |" | tee -a $OUT/B_ab.log
done
echo "elapsed $SECONDS s"
