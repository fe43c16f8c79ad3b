source .device/setup.sh
# Run 43a: main against main + the three prepared patches (both.tar: run42_qpass_nomask, run42_dkdv_rows,
# run42_rope_rcp), device ms per kernel alternated twice, then the bits of O/dQ/dK/dV of both trees.
for t in main both; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=16384:full,4096:full,16384:causal,8192:gqa_causal,4096:full_d64
for t in main both main both; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 110 python3 docs/logs/run37_configs.py bwd $C default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/A_kernels.log
  echo "elapsed $SECONDS s"
done
for t in main both; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run35_bits_hash.py $OUT/A_h35_$t.json > $OUT/A_h35_$t.log 2>&1
  echo "elapsed $SECONDS s"
done
python3 -c "
import json
a, b = json.load(open('$OUT/A_h35_main.json')), json.load(open('$OUT/A_h35_both.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/A_bits.log
echo "elapsed $SECONDS s"
