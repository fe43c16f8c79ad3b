# Run 48b (session 19): run 48a's pool probe again (its log did not come back): docs/logs/run47_pool.py without
# --keep-pool in main (.device/main.tar = 2c7a7ce) and in the kept tree (jqat.ffi.scratch_pool), alternated.
# The command as run (one line on the device), summarized by the python at its end:
source .device/setup.sh; R=$PWD; rm -rf /tmp/main && mkdir -p /tmp/main && tar -xf .device/main.tar -C /tmp/main
for round in 1 2; do for pair in main:/tmp/main new:$R; do n=${pair%%:*}; tree=${pair#*:}
  (cd $tree && PYTHONPATH=/tmp/site:$tree timeout 60 python3 docs/logs/run47_pool.py 2>&1 | grep -v -i warn \
    | sed "s|^|$round $n |" >> $OUT/run48b_pool.log); done; done
# Run 48c (session 19), the same warm machine: issue 13's rows 0, 1 and 7 on the kept tree.
#   timeout 230 python3 benchmarks/attention.py --rows 0,1,7 --fastvideo-shapes none --iters 10 --repeats 5 \
#     --out $OUT/run48c_attention.json > $OUT/run48c_attention.log 2>&1
