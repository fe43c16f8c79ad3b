# Run 44b: RoPE-QDQ with the head in power-of-two tiles (no masked lanes) against main's kernel; the rope GPU
# tests; the benchmark of record; and ncu's L2 breakdown of the width-128 case against a copy.
source .device/setup.sh
python3 docs/logs/run44_rope_ab.py $OUT/run44b_rope_ab.json main,now 2>&1 | tee $OUT/run44b_rope_ab.log
python3 -m pytest -q -m gpu tests/test_rope_qdq.py > $OUT/run44b_rope_tests.log 2>&1; tail -2 $OUT/run44b_rope_tests.log
python3 benchmarks/torch_rope_qdq.py --out $OUT/run44b_torch_rope_qdq.json > $OUT/run44b_torch_rope_qdq.log 2>&1
cat $OUT/run44b_torch_rope_qdq.log
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout 150 $NCU --clock-control none -k regex:"rope_qdq_kernel|copy|elementwise" --launch-skip 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
  --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.sum,lts__t_requests.sum,dram__bytes.sum \
  python3 docs/logs/run44_rope_ncu.py fp4/32/ue8m0 128 1 now,copy > $OUT/run44b_rope_ncu.log 2>&1
echo "rc $?" >> $OUT/run44b_rope_ncu.log
