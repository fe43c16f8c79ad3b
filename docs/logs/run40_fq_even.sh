#!/usr/bin/env bash
# Prepared in session 11 (run 39), not yet run: the quantize pass without bounds masks for whole tiles
# (docs/logs/run39_fq_even.patch: EVEN in fake_quantize_kernel, chosen by the plan when rows % BLOCK_R == 0 and
# D % BLOCK_C == 0; 456 -> 392 SASS instructions per thread, 48 -> 40 registers, logs/run39_fq_sass_*.log).
# What only the H200 can say: whether the pass gets faster (50 us per [262144, 128] tensor, a copy 35 us), and
# whether a NaN block still reads 0x7FC0 in every launch configuration (run 35 saw 0x7FFF after another change to
# the same function). Build the trees here first (carry .device):
#   R=$(pwd); git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t && (cd /tmp/t && patch -p1 -s < \
#     $R/docs/logs/run39_fq_even.patch) && tar -cf .device/fq_even.tar -C /tmp/t .
# then: bash .device/run40_fq_even.sh (one call, under 10 minutes).
source .device/setup.sh
for t in main fq_even; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
CASES=16384:window1024,16384:full,4096:causal
for t in main fq_even main; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 150 python3 docs/logs/run37_configs.py fwd $CASES default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/A_ab.log
done
(cd /tmp/fq_even && PYTHONPATH=/tmp/site:/tmp/fq_even timeout $((570 - SECONDS)) python3 -m pytest -q \
  -p no:cacheprovider -rf tests/test_nvfp4_triton.py tests/test_plan.py) > $OUT/A_tests_fq_even.log 2>&1
tail -3 $OUT/A_tests_fq_even.log; echo "elapsed $SECONDS s"
