# Run 48a (session 19): the kept tree = HEAD 2c7a7ce + run 47c's tensor-mode Q pass above D = 128 + run 47b's
# descriptors on every walk, gated to windows and segment ids (docs/logs/run48_sass_equal.py: those kernels'
# SASS is 47b's measured tma_all, every other case's is main's except key lengths without causal, one constant
# moved) + jqat.ffi.scratch_pool (the default pool's release threshold raised to 64 MiB at the first kernel with
# scratch, run 47a). GPU tests of both bindings (six pytest processes side by side, each with its own caches),
# beside them the bits against main (run35 and run48 hashes), then the pool probe of run 47a without --keep-pool
# (main = .device/main.tar, `git archive 2c7a7ce jqat kernels_triton ffi benchmarks tests pyproject.toml
# docs/logs`, against this tree, alternated).
source .device/setup.sh
R=$PWD
rm -rf /tmp/main && mkdir -p /tmp/main && tar -xf .device/main.tar -C /tmp/main
cp docs/logs/run48_bits_hash.py /tmp/main/docs/logs/
t() {
  name=$1; shift
  (TRITON_CACHE_DIR=/tmp/tc-$name JQAT_CACHE_DIR=/tmp/jc-$name timeout 300 python3 -m pytest -q -p no:cacheprovider \
     -m gpu "$@" > $OUT/run48a_tests_$name.log 2>&1; echo "rc $? elapsed $SECONDS s" >> $OUT/run48a_tests_$name.log) &
}
t attn_masks tests/test_attention_triton.py -k masks
t attn_rest tests/test_attention_triton.py -k "not masks"
t masks tests/test_masks.py tests/test_nan.py
t torch tests/test_torch.py
t callback tests/test_callback_launch.py tests/test_flax.py
t modes tests/test_numerics_modes_triton.py tests/test_ffi.py
# The bits do not depend on timing: they run beside the tests.
for pair in main:/tmp/main new:$R; do
  n=${pair%%:*}; tree=${pair#*:}
  (cd $tree && export TRITON_CACHE_DIR=/tmp/tc-bits-$n JQAT_CACHE_DIR=/tmp/jc-bits-$n PYTHONPATH=/tmp/site:$tree \
    && timeout 280 python3 docs/logs/run35_bits_hash.py $OUT/run48a_h35_$n.json > $OUT/run48a_h35_$n.log 2>&1; \
    timeout 200 python3 docs/logs/run48_bits_hash.py $OUT/run48a_h48_$n.json > $OUT/run48a_h48_$n.log 2>&1) &
done
wait
for f in $OUT/run48a_tests_*.log; do echo "== $f"; tail -3 $f; done
for round in 1 2; do
  for tree in /tmp/main $R; do
    (cd $tree && PYTHONPATH=/tmp/site:$tree timeout 60 python3 docs/logs/run47_pool.py 2>&1 | grep -v -i warn \
      | sed "s|^|$round $tree |" >> $OUT/run48a_pool.log)
  done
done
echo "pool elapsed $SECONDS s"
python3 -c "
import json
for s in ('h35', 'h48'):
  a, b = (json.load(open(f'$OUT/run48a_{s}_{n}.json')) for n in ('main', 'new'))
  for k in a: print(s, k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/run48a_bits.log
echo "elapsed $SECONDS s"
