# Run 44g: RopeQDQInplace.execute's host time with the plan cache and the cached backend check; the benchmark of
# record; a second A/B sample of the gather-first kernel (and 4 warps) against 0afe15f's; the torch and rope GPU tests.
source .device/setup.sh
python3 docs/logs/run44_rope_host_split.py 2>&1 | tee $OUT/run44g_rope_host_split.log
python3 benchmarks/torch_rope_qdq.py --out $OUT/run44g_torch_rope_qdq.json 2>&1 | tee $OUT/run44g_torch_rope_qdq.log
python3 docs/logs/run44_rope_host.py $OUT/run44g_rope_host.json 2>&1 | tee $OUT/run44g_rope_host.log
python3 docs/logs/run44_rope_ab.py $OUT/run44g_rope_ab.json tiles,now,now_w4 2>&1 | grep -v "bitwise equal to now: True" | tee $OUT/run44g_rope_ab.log
python3 -m pytest -q -m gpu tests/test_torch.py tests/test_rope_qdq.py > $OUT/run44g_gpu_tests.log 2>&1; tail -2 $OUT/run44g_gpu_tests.log
