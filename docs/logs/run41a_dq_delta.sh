#!/usr/bin/env bash
# Prepared in session 12 (run 40), not yet run: the dQ launch forms delta and fq(Q) itself
# (docs/logs/run40_dq_delta.patch: attention_bwd_dq_delta_kernel replaces the JAX binding's delta_fq launch; offline
# SASS: the dQ loops have main's instruction counts, no spills in them, no ptxas note; the interpreter suites pass).
# What only the H200 can say: the time (one launch fewer: 0.079 ms at 16k, 0.025 at 4k, against the dQ program's
# longer prologue), whether delta's bits stay (test_torch's bitwise JAX-vs-torch cases: torch keeps the delta
# launch), the memory bound, and the GPU suites. Build the trees here first (carry .device):
#   R=$(pwd); git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t && (cd /tmp/t && patch -p1 -s < \
#     $R/docs/logs/run40_dq_delta.patch) && tar -cf .device/dq_delta.tar -C /tmp/t .
# then: bash .device/run41a_dq_delta.sh (one call, under 10 minutes).
source .device/setup.sh
for t in main dq_delta; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=16384:window1024,4096:causal,4096:full,16384:full,16384:causal,8192:gqa_causal,4096:full_d64
for t in main dq_delta main; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 150 python3 docs/logs/run37_configs.py bwd $C default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/A_ab.log
done
for t in main dq_delta; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 60 python3 docs/logs/run35_bits_hash.py /tmp/h_$t.json \
    causal,window_lens,segments_causal_lens,d80_ragged,dense,d64 > /dev/null 2>&1
done
python3 -c "
import json
a, b = json.load(open('/tmp/h_main.json')), json.load(open('/tmp/h_dq_delta.json'))
for k in b: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in b[k]})
" 2>&1 | tee $OUT/A_bits.log
(cd /tmp/dq_delta && PYTHONPATH=/tmp/site:/tmp/dq_delta timeout 60 python3 benchmarks/attention.py --memory-only \
  --out $OUT/A_memory.json 2>&1 | grep -i "measured peak" | tee $OUT/A_memory.log)
(cd /tmp/dq_delta && PYTHONPATH=/tmp/site:/tmp/dq_delta timeout 150 python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_torch.py -k bitwise) > $OUT/A_tests_torch.log 2>&1
tail -2 $OUT/A_tests_torch.log
(cd /tmp/dq_delta && PYTHONPATH=/tmp/site:/tmp/dq_delta timeout $((575 - SECONDS)) python3 -m pytest -q \
  -p no:cacheprovider -rf tests/test_nan.py tests/test_masks.py) > $OUT/A_tests.log 2>&1
tail -3 $OUT/A_tests.log; echo "elapsed $SECONDS s"
