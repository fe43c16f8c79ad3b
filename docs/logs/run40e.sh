#!/usr/bin/env bash
# Run 40e: peak memory of jax.grad at (1, 8, 65536, 128) causal (issue 13 item 4) in main and in the checkout,
# whose VJP keeps fq(Q), fq(K), fq(V) as residuals; then issue 13's shapes against cuDNN (time-boxed).
source .device/setup.sh
rm -rf /tmp/main && mkdir -p /tmp/main && tar -xf .device/main.tar -C /tmp/main
for t in main checkout; do
  P=$PWD; [ $t = main ] && P=/tmp/main
  (cd $P && PYTHONPATH=/tmp/site:$P timeout 90 python3 benchmarks/attention.py --memory-only --out $OUT/E_memory_$t.json \
    2>&1 | grep -v -i warn > $OUT/E_memory_$t.log)
  grep -i "peak" $OUT/E_memory_$t.log | head -5
done
echo "memory elapsed $SECONDS s"
timeout $((330 - SECONDS)) python3 benchmarks/ab_attention.py --iters 10 --repeats 5 --shapes 0,1,4,5 --cudnn \
  --out $OUT/E_ab.json 2>&1 | grep -v -i warn > $OUT/E_ab.log
cat $OUT/E_ab.log; echo "elapsed $SECONDS s"
