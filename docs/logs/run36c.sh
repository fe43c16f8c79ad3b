#!/usr/bin/env bash
# Run 36c: JAX binding per-kernel times: SEQ_ALIGN hint x forward Q pass; fq pass launch (16 per thread).
# JQAT_FWD_Q_PASS, JQAT_SEQ_ALIGN and JQAT_Q_IN_REGS were switches of the experimental tree of this run only
# (ffi/plan.py); the final tree has none of them (docs/BENCHMARKS.md, run 36).
source .device/setup.sh
for cfg in "0 0" "1 0" "0 1" "1 1"; do
  set -- $cfg
  for c in "16384 full" "4096 full" "4096 causal" "16384 window:1024"; do
    JQAT_SEQ_ALIGN=$1 JQAT_FWD_Q_PASS=$2 timeout 60 python3 docs/logs/run36_jax_kernels.py $c 2>/dev/null | sed "s/^/align=$1 qpass=$2 /" >> $OUT/C_jax_kernels.log
  done
done
cat $OUT/C_jax_kernels.log
