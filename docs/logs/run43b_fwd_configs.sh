#!/usr/bin/env bash
# Session 15: run as part of docs/logs/run43a.sh / run43b.sh (results: docs/BENCHMARKS.md, "Run 43").
# Prepared in session 14 (run 42), not yet run: the forward's launch configurations again, now that the E2M1
# rounding is a quotient (the D = 128 default, 64 rows on 4 warps with 3 stages, was swept in runs 9-10 and 36 for
# the threshold tree). Offline SASS on the tree of docs/logs/run42_qpass_nomask.patch (fq(Q) from the pass), unmasked
# loop per iteration: default 930 (16 B stack); 128 rows on 8 warps 917 (no stack, 131 KB shared memory: one program
# per SM); 64 rows, 2 stages 963 (72 B stack). Run after the qpass_nomask A/B (docs/logs/run43_ab_patch.sh), on
# its tree (or `main` if the patch was not kept):
#   bash .device/run43b_fwd_configs.sh qpass_nomask
source .device/setup.sh
t=${1:-qpass_nomask}
rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t
PYTHONPATH=/tmp/site:/tmp/$t timeout 560 python3 docs/logs/run37_configs.py fwd 16384:full,4096:full,16384:causal \
  default block_m=128,num_warps=8 block_m=128,num_warps=8,num_stages=2 block_m=64,num_warps=4,num_stages=4 2>&1 \
  | grep -v -i warn | tee $OUT/B_fwd_configs.log
echo "elapsed $SECONDS s"
