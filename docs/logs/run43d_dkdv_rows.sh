#!/usr/bin/env bash
# Prepared in session 14 (run 42), not yet run: the dK/dV kernel forms its Q and dO tile addresses as a scalar step
# plus offsets that do not change along its walk (docs/logs/run42_dkdv_rows.patch), instead of a 64-bit row index
# per element each iteration. Offline SASS at D = 128: unmasked loop 648 -> 615 instructions (causal 648 -> 617, masked
# 845 -> 823), stack 48 -> 72 B outside the loops; D = 64 and GQA unchanged within 1%. The dK/dV kernel is half of
# fwd+bwd and latency-bound, where run 42's quotient turned 9% fewer instructions into 10-15% less time. Interpreter:
# tests/test_attention_triton.py tests/test_masks.py tests/test_nan.py 60 passed on the patched tree.
# Build the trees here first (carry .device):
#   R=$(pwd); git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t && (cd /tmp/t && patch -p1 -s < \
#     $R/docs/logs/run42_dkdv_rows.patch) && tar -cf .device/dkdv.tar -C /tmp/t .
source .device/setup.sh
for t in main dkdv; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=16384:full,4096:full,16384:causal,8192:gqa_causal,4096:full_d64
for t in main dkdv main dkdv; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 110 python3 docs/logs/run37_configs.py bwd $C default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/D_kernels.log
done
for t in main dkdv; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run35_bits_hash.py /tmp/h_$t.json \
    dense,causal,gqa_causal,window_lens,segments_causal_lens > /dev/null 2>&1
done
python3 -c "
import json
a, b = json.load(open('/tmp/h_main.json')), json.load(open('/tmp/h_dkdv.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/D_bits.log
echo "elapsed $SECONDS s"
