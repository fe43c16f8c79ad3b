#!/usr/bin/env bash
# Prepared in session 14 (run 42), not yet run: the no-mask forward at 64 < D <= 128 reads fq(Q) from the quantize
# pass instead of rounding its own Q tile (docs/logs/run42_qpass_nomask.patch: one condition in ffi/plan.py and its
# test). Why: with run 42's quotient rounding the kernel that rounds its own Q spills in its loop (965 instructions,
# 21 LDL / 7 STL per iteration, offline SASS) and did not get faster on the H200 (8.35 -> 8.40 ms at 16k), while the
# causal kernel, which reads fq(Q) and does not spill (930), got 12% faster. With the patch the no-mask loop is the
# causal kernel's: 930 instructions, no spills (offline). Run 36 measured this plan 5.6% slower at 1047 instructions.
# What only the H200 can say: the time (issue 13's two no-mask D = 128 rows are at 2.07x and 2.03x of cuDNN, target
# 2.0), and whether the bits stay (fq(Q) is the same function in the pass and in the kernel).
# Build the trees here first (carry .device):
#   R=$(pwd); git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t && (cd /tmp/t && patch -p1 -s < \
#     $R/docs/logs/run42_qpass_nomask.patch) && tar -cf .device/qpass.tar -C /tmp/t .
# then: bash .device/run43a_qpass_nomask.sh (one call, under 10 minutes).
source .device/setup.sh
for t in main qpass; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=16384:full,4096:full,8192:full,4096:full_d64,16384:causal
for t in main qpass main qpass; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 110 python3 docs/logs/run37_configs.py bwd $C default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/A_kernels.log
done
for t in main qpass; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run35_bits_hash.py /tmp/h_$t.json dense,d64,segments,d256 \
    > /dev/null 2>&1
done
python3 -c "
import json
a, b = json.load(open('/tmp/h_main.json')), json.load(open('/tmp/h_qpass.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/A_bits.log
(cd /tmp/qpass && PYTHONPATH=/tmp/site:/tmp/qpass timeout $((570 - SECONDS)) python3 benchmarks/ab_attention.py \
  --iters 10 --repeats 5 --shapes 0,4 --cudnn --out $OUT/A_ab.json 2>&1 | grep -v -i warn) | tee $OUT/A_ab.log
echo "elapsed $SECONDS s"
