#!/usr/bin/env bash
# Not run as such: session 11 ran the same A/B, with the trees of all three patches and more cases, in one call
# (docs/logs/run39a.sh, logs/run39a_ab.log).
# Prepared in session 10 (run 38), not yet run: one pipelined walk over a masked program's tiles, the edge mask a
# runtime branch (docs/logs/run38_window_single_walk.patch: window only; run38_single_walk_causal.patch: window
# and causal), forward and dQ; and fq(Q) from the pass for packed documents (run38_segments_qpass.patch: the
# packed non-causal forward's loops lose their spills offline); each against main. Build the trees here first:
#   R=$(pwd); git archive HEAD jqat kernels_triton ffi benchmarks > .device/main.tar
#   for p in window_single_walk single_walk_causal segments_qpass; do rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar \
#     -C /tmp/t && (cd /tmp/t && patch -p1 -s < $R/docs/logs/run38_$p.patch) && tar -cf .device/$p.tar -C /tmp/t .; done
# then: cp docs/logs/run39a_single_walk.sh .device/ and run, in two calls of under 10 minutes (carry .device):
#   bash .device/run39a_single_walk.sh "main window_single_walk single_walk_causal" \
#     16384:window1024,4096:causal,16384:causal,8192:gqa_causal
#   bash .device/run39a_single_walk.sh "main segments_qpass" 16384:packed1024,16384:packed_causal1024
source .device/setup.sh
TREES=$1
CASES=$2
for t in $TREES; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
for t in $TREES; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 170 python3 docs/logs/run37_configs.py fwd $CASES default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/A_ab.log
done
# Bits next (the same tiles in the same order; identical under the interpreter, docs/logs/run38_single_walk_*):
#   docs/logs/run35_bits_hash.py OUT causal,gqa_causal,d80_ragged,window_lens,segments_causal_lens,row in each tree.
