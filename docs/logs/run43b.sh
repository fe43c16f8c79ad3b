source .device/setup.sh
# Run 43b: RoPE-QDQ main vs kept (kept = run42_qpass_nomask + run42_rope_rcp), alternated twice, the rope GPU
# tests on kept, then the forward's launch configs on kept.
for t in main kept; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
for t in main kept main kept; do
  (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 90 python3 benchmarks/torch_rope_qdq.py --out /tmp/r_$t.json 2>&1 \
    | grep -v -i warn | sed "s/^/$t /") | tee -a $OUT/B_rope.log
  echo "elapsed $SECONDS s"
done
cp /tmp/r_main.json $OUT/B_rope_main.json; cp /tmp/r_kept.json $OUT/B_rope_kept.json
(cd /tmp/kept && PYTHONPATH=/tmp/site:/tmp/kept timeout 150 python3 -m pytest -q -p no:cacheprovider \
  -rf -m gpu tests/test_rope_qdq.py) > $OUT/B_rope_tests.log 2>&1; tail -2 $OUT/B_rope_tests.log
echo "elapsed $SECONDS s"
PYTHONPATH=/tmp/site:/tmp/kept timeout $((580 - SECONDS)) python3 docs/logs/run37_configs.py fwd 16384:full,4096:full,16384:causal \
  default block_m=128,num_warps=8 block_m=128,num_warps=8,num_stages=2 block_m=64,num_warps=4,num_stages=4 2>&1 \
  | grep -v -i warn | tee $OUT/B_fwd_configs.log
echo "elapsed $SECONDS s"
