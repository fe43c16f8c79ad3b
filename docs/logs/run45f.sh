# Run 45f: run 45e found the window's dQ waiting for its K/V tiles (18% of samples at the loop top, DEPBAR 0 with
# 2 stages). Thinner key tiles with deeper pipelines in the same shared memory: dQ ms, then the bits of O, dQ, dK, dV
# of the window case under the best one against the default.
source .device/setup.sh
for c in default dq_block_n=32,dq_num_stages=3 dq_block_n=32,dq_num_stages=4 default; do
  timeout 60 python3 docs/logs/run37_configs.py bwd 16384:window1024 $c 2>&1 | grep -v -i warn | tail -1 \
    | tee -a $OUT/run45f_bwd.log
done
echo "elapsed $SECONDS s"
timeout 60 python3 docs/logs/run35_bits_hash.py /tmp/h0.json window_lens > /dev/null 2>&1
JQAT_ATTN_BWD_CONFIG=dq_block_n=32,dq_num_stages=4 timeout 60 python3 docs/logs/run35_bits_hash.py /tmp/h1.json window_lens > /dev/null 2>&1
python3 -c "
import json
a, b = json.load(open('/tmp/h0.json')), json.load(open('/tmp/h1.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/run45f_bits.log
echo "elapsed $SECONDS s"
