source .device/setup.sh
# Run 42c: bits of main vs the new tree (run 42b compared a file with itself), the forward's two changes apart
# (v1: E2M1 quotient only; v2: row max from raw scores only; new: both), and the exhaustive test's negative control.
for t in main new v1 v2 nocorr; do rm -rf /tmp/t_$t && mkdir -p /tmp/t_$t && tar -xf .device/$t.tar -C /tmp/t_$t; done
(cd /tmp/t_nocorr && PYTHONPATH=/tmp/site:/tmp/t_nocorr timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_nvfp4_triton.py -k e2m1_paths 2>&1 | tail -3) > $OUT/C_negative_control.log; cat $OUT/C_negative_control.log
for t in main new; do
  PYTHONPATH=/tmp/site:/tmp/t_$t timeout 100 python3 docs/logs/run35_bits_hash.py $OUT/C_h35_$t.json > /dev/null 2>&1
  PYTHONPATH=/tmp/site:/tmp/t_$t timeout 60 python3 docs/logs/run42_bits_hash.py $OUT/C_h42_$t.json > /dev/null 2>&1
done
python3 -c "
import json
for s in ('35', '42'):
  a, b = json.load(open('$OUT/C_h%s_main.json' % s)), json.load(open('$OUT/C_h%s_new.json' % s))
  for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/C_bits.log
C=16384:full,4096:full,16384:causal,16384:window1024
for t in main v1 v2 new; do
  PYTHONPATH=/tmp/site:/tmp/t_$t timeout 110 python3 docs/logs/run37_configs.py bwd $C default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/C_kernels.log
done
echo "elapsed $SECONDS s"
