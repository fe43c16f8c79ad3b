# Run 56a (session 24). Carry .device. Writes up to 8 files.
# (1) the forward alone against cuDNN's, 6 rounds in each of two processes (docs/logs/run56_fwd.py);
# (2) the GPU tests that runs 54-55 did not reach on 3ede5c3's kernels (callback launcher, ffi, flax, RoPE-QDQ,
#     qat_matmul, pallas, bench numerics, grad fidelity), three pytest processes side by side (compiles dominate).
source .device/setup.sh
for p in 1 2; do
  timeout 170 python3 docs/logs/run56_fwd.py $OUT/run56a_fwd_$p.json p$p 6 2>&1 | grep -v -i warn > $OUT/run56a_fwd_$p.log
  grep ratio_median $OUT/run56a_fwd_$p.log; echo "elapsed $SECONDS s"
done
B=$((575 - SECONDS))
timeout $B python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_rope_qdq.py tests/test_qat_matmul.py \
  > $OUT/run56a_tests1.log 2>&1 &
timeout $B python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_ffi.py tests/test_callback_launch.py \
  tests/test_flax.py > $OUT/run56a_tests2.log 2>&1 &
timeout $B python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_nvfp4_pallas.py tests/test_bench_numerics.py \
  tests/test_grad_fidelity.py > $OUT/run56a_tests3.log 2>&1 &
wait
for f in $OUT/run56a_tests*.log; do echo "== $f"; tail -3 $f; done; echo "elapsed $SECONDS s"
