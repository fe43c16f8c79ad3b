# Run 45b: the forward's exact rescale skip (skip.tar: main + docs/logs/run45_rescale_skip.patch) against main (main.tar): device ms per kernel alternated
# twice, the sink data, then the bits of both trees.
source .device/setup.sh
for t in main skip; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=16384:full,4096:full,16384:causal,16384:window1024
for t in main skip main skip; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 /tmp/$t/docs/logs/run37_configs.py bwd $C default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/run45b_kernels.log
  echo "elapsed $SECONDS s"
done
for t in main skip; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 60 python3 docs/logs/run45_sink.py 16384,4096,16384:causal 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/run45b_sink.log
done
echo "elapsed $SECONDS s"
for t in main skip; do
  (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run35_bits_hash.py $OUT/run45b_h_$t.json \
    > /dev/null 2>&1)
done
python3 -c "
import json
a, b = json.load(open('$OUT/run45b_h_main.json')), json.load(open('$OUT/run45b_h_skip.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/run45b_bits.log
echo "elapsed $SECONDS s"
