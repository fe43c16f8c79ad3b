# Run 55a (session 23): fq_tile's NaN flag from the amax and BF16 stored by its high halves (cast_fq), A/B against
# the tree before (docs/logs/run55_cast_fq.patch reversed in a copy). Carry .device. Writes 4 files.
# (1) the quantize pass alone vs a copy (docs/logs/run55_pass.py), trees alternated twice; (2) the GPU tests of the
# quantizer (bitwise against the oracle, NaN blocks 0x7FC0) and of the kernels that quantize Q themselves;
# (3) run 53c's forward / fwd+bwd / window A/B (docs/logs/run53_ab.py), one process per tree.
source .device/setup.sh
rm -rf /tmp/base && mkdir -p /tmp/base && cp -r benchmarks docs ffi jqat kernels_triton pyproject.toml /tmp/base/ \
  && (cd /tmp/base && patch -s -R -p1 < docs/logs/run55_cast_fq.patch) || exit 1
for i in 1 2; do
  timeout 60 python3 docs/logs/run55_pass.py new 2>&1 | grep -v -i warn >> $OUT/run55a_pass.log
  PYTHONPATH=/tmp/site:/tmp/base timeout 60 python3 docs/logs/run55_pass.py base 2>&1 | grep -v -i warn >> $OUT/run55a_pass.log
done
cat $OUT/run55a_pass.log; echo "elapsed $SECONDS s"
timeout 240 python3 -m pytest -q -rs -m gpu tests/test_nvfp4_triton.py tests/test_attention_triton.py \
  tests/test_numerics_modes_triton.py -x > $OUT/run55a_tests.log 2>&1; tail -3 $OUT/run55a_tests.log; echo "elapsed $SECONDS s"
timeout 150 python3 docs/logs/run53_ab.py $OUT/run55a_ab_new.json new 2>&1 | grep -v -i warn > $OUT/run55a_ab.log
PYTHONPATH=/tmp/site:/tmp/base timeout 150 python3 docs/logs/run53_ab.py $OUT/run55a_ab_base.json base 2>&1 \
  | grep -v -i warn >> $OUT/run55a_ab.log
cat $OUT/run55a_ab.log; echo "elapsed $SECONDS s"
