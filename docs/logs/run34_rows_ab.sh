#!/usr/bin/env bash
# L2: A/B old vs new trees (issue 13's shapes), the headline table, a dK/dV config sweep, tensor-mode checks.
source .device/setup.sh 2>/dev/null
rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && cp -r jqat kernels_triton ffi benchmarks /tmp/oldtree/
cp .device/oldbwd/attention_bwd.py /tmp/oldtree/kernels_triton/attention_bwd.py; cp .device/oldbwd/nvfp4.py /tmp/oldtree/kernels_triton/nvfp4.py
AB="benchmarks/ab_attention.py --iters 10 --repeats 5"
for t in new old new; do
  if [ $t = old ]; then P=/tmp/site:/tmp/oldtree; S=/tmp/oldtree/$AB; else P=/tmp/site:$PWD; S=$AB; fi
  PYTHONPATH=$P timeout 130 python3 $S --out /tmp/ab_$t.json 2>&1 | grep -v Warn | sed "s/^/$t /" >> $OUT/L2_ab.log
done
tail -4 $OUT/L2_ab.log
timeout 150 python3 benchmarks/attention.py --shapes full --fastvideo-shapes none --iters 5 --repeats 3 --out $OUT/L2_attention_full.json > $OUT/L2_attention_full.log 2>&1; echo "rc=$?" >> $OUT/L2_attention_full.log
grep -v Warn $OUT/L2_attention_full.log | tail -14
