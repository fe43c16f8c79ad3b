# Run 45c: Nsight Compute on today's three attention kernels (full attention and the 1024-token window, (1, 16,
# 16384, 128) bf16, through benchmarks/ncu_attention.py): speed of light, occupancy, warp states, instruction
# statistics and source counters (stall samples per SASS instruction), real clocks. The per-instruction table is
# exported as CSV for docs/logs/run45_stalls.py.
source .device/setup.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
$NCU --version | tail -1
K='regex:attention_(fwd|bwd_dq|bwd_dkdv)'
for c in full window; do
  a=""; [ $c = window ] && a="--window 1024"
  timeout 200 $NCU --clock-control none -k "$K" --launch-skip 3 --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section InstructionStats --section SourceCounters --section ComputeWorkloadAnalysis \
    -o $OUT/run45c_$c python3 benchmarks/ncu_attention.py --seq 16384 $a > $OUT/run45c_${c}_run.log 2>&1
  echo "$c rc $? elapsed $SECONDS s"
  $NCU -i $OUT/run45c_$c.ncu-rep --page details > $OUT/run45c_${c}_details.log 2>&1
  $NCU -i $OUT/run45c_$c.ncu-rep --page source --csv --print-source sass > $OUT/run45c_${c}_source.csv 2> $OUT/run45c_${c}_source.err
  echo "source rc $? $(wc -c < $OUT/run45c_${c}_source.csv) bytes"
done
ls -la $OUT
