# Run 53c (session 22). Carry .device (with run53c.patch = git diff of the change against f85faa7). Writes 5 files.
# (1) docs/logs/run53_ab.py in the tree before (the patch reversed: the pass as one launch per tensor, D <= 64 as
#     before) and in this one: issue 13's 8 x 1024 causal, 4k and D = 64 rows and the window, each with cuDNN.
# (2) GPU tests: the pass's one launch against the oracle, torch and JAX bit for bit, the no-grad forward.
source .device/setup.sh
rm -rf /tmp/base && mkdir /tmp/base && cp -r benchmarks docs ffi jqat kernels_triton pyproject.toml /tmp/base/ \
  && (cd /tmp/base && patch -s -R -p1 < $OLDPWD/.device/run53c.patch) || exit 1
(cd /tmp/base && PYTHONPATH=/tmp/site:/tmp/base timeout 120 python3 docs/logs/run53_ab.py $OUT/run53c_base.json base \
  2>&1 | grep -v -i warn > $OUT/run53c_base.log); echo "base elapsed $SECONDS s"
timeout 120 python3 docs/logs/run53_ab.py $OUT/run53c_new.json new 2>&1 | grep -v -i warn > $OUT/run53c_new.log
echo "new elapsed $SECONDS s"
timeout $((350 - SECONDS)) python3 -m pytest -q -rs tests/test_attention_triton.py tests/test_torch.py \
  -k "several or rows_kernel or bitwise_gpu or no_grad" > $OUT/run53c_tests.log 2>&1
tail -3 $OUT/run53c_tests.log; echo "elapsed $SECONDS s"
