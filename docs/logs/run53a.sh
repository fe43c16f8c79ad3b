# Run 53a (session 22). Carry .device. Writes 5 files.
# (1) fq(Q) from the quantize pass at D <= 64 without masks (docs/logs/run53_qpass64.patch), against main's kernel
#     rounding its own Q (decided at 128 rows / 8 warps in run 36, never measured on today's 64 / 4). Offline
#     (benchmarks/sass_stats.py --batch 2 --head-dim 64|32 --kernels fwd_out,fwd): the primal at D = 64 140 registers
#     (163 own Q), loop 779 (781); the training forward 220 (228), loop 832 (836); at D = 32 the training forward 128
#     registers (163): four programs per SM instead of three. Each tree also with maxnreg=128 (the primal at D = 64
#     from the pass then needs 12 fewer registers, not 35). Trees alternated, each script alternates twice inside.
# (2) the per-kernel device times of fwd+bwd at 8 x 1024 causal (issue 13's last row: how much the O(S) launches
#     weigh in the short sequences).
source .device/setup.sh
rm -rf /tmp/qpass && mkdir /tmp/qpass && cp -r benchmarks docs ffi jqat kernels_triton pyproject.toml /tmp/qpass/ \
  && (cd /tmp/qpass && patch -p1 < docs/logs/run53_qpass64.patch) || exit 1
for i in 1 2; do
  timeout 150 python3 docs/logs/run51_d64.py $OUT/run53a_main$i.json default maxnreg=128 > /dev/null 2>&1
  echo "main $i elapsed $SECONDS s"
  (cd /tmp/qpass && PYTHONPATH=/tmp/site:/tmp/qpass timeout 150 python3 docs/logs/run51_d64.py \
    $OUT/run53a_qpass$i.json default maxnreg=128 > /dev/null 2>&1); echo "qpass $i elapsed $SECONDS s"
done
timeout 100 python3 benchmarks/kernel_times.py --out $OUT/run53a_kernels_8x1024.json --batch 8 --seq 1024 \
  --cases full,causal > /dev/null 2>&1; echo "kernels rc $? elapsed $SECONDS s"
