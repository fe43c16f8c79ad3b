# Run 45d: launch configurations of the window's kernels (1024-token window at 16k, D = 128) through the JAX
# binding: the dK/dV kernel (never swept for the window), then dQ and the forward; one process per configuration,
# the sweep twice, the second pass in reverse order (run-to-run spread).
source .device/setup.sh
B="default kv_num_stages=2 kv_num_stages=4 kv_block_m=16 kv_block_m=64 kv_block_n=128,kv_num_warps=8 kv_block_n=32,kv_block_m=64 dq_num_stages=3 dq_block_n=32"
R=$(echo $B | tr ' ' '\n' | tac | tr '\n' ' ')
for c in $B $R; do
  timeout 60 python3 docs/logs/run37_configs.py bwd 16384:window1024 $c 2>&1 | grep -v -i warn | tail -1 \
    | tee -a $OUT/run45d_bwd.log
done
echo "elapsed $SECONDS s"
for c in default num_stages=2 num_stages=4 default; do
  timeout 60 python3 docs/logs/run37_configs.py fwd 16384:window1024 $c 2>&1 | grep -v -i warn | tail -1 \
    | tee -a $OUT/run45d_fwd.log
done
echo "elapsed $SECONDS s"
