# Run 51c (session 21): the forward at D <= 64 on 64 rows / 4 warps / 3 stages (was 128 / 8 / 3). GPU tests of the
# D <= 64 cases (attention, masks at D = 48 and 64, determinism, vmap, the callback launcher incl. the primal at
# D = 64), the D <= 64 sweep with the old and a 4-stage config, then benchmarks/attention.py on every row. 6 files.
source .device/setup.sh
timeout 240 python3 -m pytest -q -rs -m gpu tests/test_attention_triton.py tests/test_callback_launch.py \
  -k "D64 or -64- or -48- or deterministic or vmap_and_jit or callback or primal" > $OUT/run51c_tests.log 2>&1
tail -3 $OUT/run51c_tests.log; echo "elapsed $SECONDS s"
timeout 150 python3 docs/logs/run51_d64.py $OUT/run51c_d64.json default block_m=64,num_warps=4,num_stages=4 \
  block_m=128,num_warps=8,num_stages=3 > $OUT/run51c_d64.log 2>&1; echo "elapsed $SECONDS s"
timeout $((570 - SECONDS)) python3 benchmarks/attention.py --fastvideo-shapes none --iters 10 --repeats 5 \
  --out $OUT/run51c_attention.json > $OUT/run51c_attention.log 2>&1
echo "rc $? elapsed $SECONDS s"; grep -v -i warn $OUT/run51c_attention.log | tail -14
