# Run 44d: RoPE-QDQ with the position ids and cache rows loaded first (the working tree) against 0afe15f's kernel;
# the benchmark of record first this time (run 44c ran it after the A/B), SM clock and power sampled throughout;
# the rope GPU tests.
source .device/setup.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 250 > $OUT/run44d_smi.csv &
SMI=$!
python3 benchmarks/torch_rope_qdq.py --out $OUT/run44d_torch_rope_qdq.json 2>&1 | tee $OUT/run44d_torch_rope_qdq.log
python3 docs/logs/run44_rope_ab.py $OUT/run44d_rope_ab.json tiles,now,now_w4,tail_first 2>&1 | tee $OUT/run44d_rope_ab.log
kill $SMI
python3 -m pytest -q -m gpu tests/test_rope_qdq.py > $OUT/run44d_rope_tests.log 2>&1; tail -2 $OUT/run44d_rope_tests.log
