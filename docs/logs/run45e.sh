# Run 45e: run 45c's window profile again for its per-instruction stall samples (45c's CSV of the window did not
# come back: too many files), summarised on the device by docs/logs/run45_stalls.py.
source .device/setup.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout 200 $NCU --clock-control none -k 'regex:attention_(fwd|bwd_dq|bwd_dkdv)' --launch-skip 3 --launch-count 3 \
  --section SourceCounters --section WarpStateStats -o /tmp/w python3 benchmarks/ncu_attention.py --seq 16384 \
  --window 1024 > /tmp/w_run.log 2>&1
echo "rc $? elapsed $SECONDS s"
$NCU -i /tmp/w.ncu-rep --page source --csv --print-source sass > /tmp/w_source.csv
python3 docs/logs/run45_stalls.py /tmp/w_source.csv 30 > $OUT/run45e_window_stalls.log 2>&1
grep -v "^   " $OUT/run45e_window_stalls.log
