# Run 47a (prepared in session 18, not yet run): the per-call cost of the forward's global scratch (run 46: the
# jitted forward lost 0.015-0.03 ms at D = 64 with no kernel gain). docs/logs/run47_pool.py in main's tree (26e1fc7,
# no scratch; build .device/main.tar with `git archive 26e1fc7 jqat kernels_triton ffi benchmarks tests pyproject.toml
# docs/logs > .device/main0.tar`) and in this tree, with and without --keep-pool, alternated. About 2 minutes.
source .device/setup.sh
R=$PWD
rm -rf /tmp/main && mkdir -p /tmp/main && tar -xf .device/main0.tar -C /tmp/main
cp docs/logs/run47_pool.py /tmp/main/docs/logs/
for round in 1 2; do
  for tree in /tmp/main $R; do
    for flag in "" --keep-pool; do
      (cd $tree && PYTHONPATH=/tmp/site:$tree timeout 120 python3 docs/logs/run47_pool.py $flag 2>&1 | grep -v -i warn \
        | sed "s|^|$round $tree |" | tee -a $OUT/run47a_pool.log)
    done
  done
done
echo "elapsed $SECONDS s"
# The GPU mask cases that run 46 did not reach, on this tree (D = 48 and D = 96 mask combinations, masks under vmap).
timeout $((590 - SECONDS)) python3 -m pytest -q -m gpu tests/test_attention_triton.py \
  -k "1-777-777-2-1-48-all or 1-513-513-4-2-96-lengths or masks_under_vmap" > $OUT/run47a_gpu_tests.log 2>&1
tail -3 $OUT/run47a_gpu_tests.log
echo "elapsed $SECONDS s"
