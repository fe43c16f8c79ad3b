#!/usr/bin/env bash
# Session 15: run as part of docs/logs/run43a.sh / run43b.sh (results: docs/BENCHMARKS.md, "Run 43").
# Prepared in session 14 (run 42), not yet run: main against main + one prepared patch, in one device call.
#   bash docs/logs/run43_ab_patch.sh NAME KERNEL_CASES BITS_CASES [AB_SHAPES]
# NAME: the patch docs/logs/run42_NAME.patch; KERNEL_CASES as docs/logs/run37_configs.py takes them (device ms per
# kernel, trees alternated twice); BITS_CASES: cases of docs/logs/run35_bits_hash.py (the bits of both trees);
# AB_SHAPES: indices for benchmarks/ab_attention.py --cudnn on the patched tree (optional).
# Build the trees here first (carry .device):
#   R=$(pwd); git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t && (cd /tmp/t && patch -p1 -s < \
#     $R/docs/logs/run42_NAME.patch) && tar -cf .device/NAME.tar -C /tmp/t .
# The two prepared this session (what each changes and why: docs/PERFORMANCE.md, fourteenth session):
#   bash docs/logs/run43_ab_patch.sh qpass_nomask 16384:full,4096:full,8192:full,4096:full_d64,16384:causal \
#     dense,d64,segments,d256 0,4
#   bash docs/logs/run43_ab_patch.sh dkdv_rows 16384:full,4096:full,16384:causal,8192:gqa_causal,4096:full_d64 \
#     dense,causal,gqa_causal,window_lens,segments_causal_lens
name=$1 cases=$2 bits=$3 shapes=${4:-}
source .device/setup.sh
for t in main $name; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
for t in main $name main $name; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 110 python3 docs/logs/run37_configs.py bwd $cases default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/${name}_kernels.log
done
for t in main $name; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run35_bits_hash.py /tmp/h_$t.json $bits > /dev/null 2>&1
done
python3 -c "
import json
a, b = json.load(open('/tmp/h_main.json')), json.load(open('/tmp/h_$name.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/${name}_bits.log
if [ -n "$shapes" ]; then
  (cd /tmp/$name && PYTHONPATH=/tmp/site:/tmp/$name timeout $((570 - SECONDS)) python3 benchmarks/ab_attention.py \
    --iters 10 --repeats 5 --shapes $shapes --cudnn --out $OUT/${name}_ab.json 2>&1 | grep -v -i warn) \
    | tee $OUT/${name}_ab.log
fi
echo "elapsed $SECONDS s"
