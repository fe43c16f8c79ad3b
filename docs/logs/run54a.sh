# Run 54a (prepared in session 22, not yet run). Carry .device. Writes 3 files.
# The O-alone forward's unmasked tiles taking the row max of the raw products, scaled once per row (POS_SCALE, for a
# positive softmax scale): docs/logs/run54_rowmax.patch, applied to this tree first (`git apply`). Offline (sm_90a,
# `python benchmarks/sass_stats.py --batch 1 --head-dim 64|128 --seq 4096 [--causal|--segments] --kernels fwd_out`)
# the unmasked loop loses 30 of its 778 (D = 64) or 809 (D = 128) instructions (the FMUL per element that the row max
# read; the exponent was already one FFMA per element), registers and stack unchanged; masked and windowed walks are
# unchanged. (1) A/B in one process, outputs hashed (must be equal); (2) the GPU tests that compare the primal with
# the training forward's O bit for bit (the exponent's contraction on the GPU is what keeps them equal).
source .device/setup.sh
git apply docs/logs/run54_rowmax.patch || exit 1
timeout 150 python3 docs/logs/run54a_rowmax.py $OUT/run54a_rowmax.json 2>&1 | grep -v -i warn > $OUT/run54a_rowmax.log
echo "elapsed $SECONDS s"
timeout 200 python3 -m pytest -q -rs -m gpu tests/test_callback_launch.py tests/test_torch.py -k "primal or no_grad" \
  > $OUT/run54a_tests.log 2>&1; tail -3 $OUT/run54a_tests.log; echo "elapsed $SECONDS s"
