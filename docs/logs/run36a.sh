#!/usr/bin/env bash
# Run 36a: quantize-pass launch configurations; the forward with Q quantized by the pass (JQAT_FWD_Q_PASS=1) A/B.
# JQAT_FWD_Q_PASS, JQAT_SEQ_ALIGN and JQAT_Q_IN_REGS were switches of the experimental tree of this run only
# (ffi/plan.py); the final tree has none of them (docs/BENCHMARKS.md, run 36).
source .device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader > $OUT/gpu.txt
timeout 120 python3 docs/logs/run36_fq_probe.py > $OUT/A_fq_probe.log 2>&1
for t in 0 1 0 1; do
  JQAT_FWD_Q_PASS=$t timeout 100 python3 benchmarks/kernel_times.py --out $OUT/A_kt16_$t.json --cases full,window:1024,window:4096 2>&1 | grep -v Warn | sed "s/^/qpass=$t /" >> $OUT/A_kernel_times.log
done
for t in 0 1; do
  JQAT_FWD_Q_PASS=$t timeout 60 python3 benchmarks/kernel_times.py --seq 4096 --out $OUT/A_kt4_$t.json --cases full,causal 2>&1 | grep -v Warn | sed "s/^/qpass=$t /" >> $OUT/A_kernel_times4.log
done
for t in 0 1 0 1; do
  JQAT_FWD_Q_PASS=$t timeout 80 python3 benchmarks/ab_attention.py --iters 10 --repeats 5 --shapes 0,1,4 --out $OUT/A_ab_$t.json 2>&1 | grep -v Warn | sed "s/^/qpass=$t /" >> $OUT/A_ab.log
done
for t in 0 1; do
  JQAT_FWD_Q_PASS=$t timeout 80 python3 benchmarks/masks.py --cases window --out $OUT/A_masks_$t.json 2>&1 | grep -v Warn | tail -3 | sed "s/^/qpass=$t /" >> $OUT/A_masks.log
done
cat $OUT/gpu.txt $OUT/A_kernel_times.log $OUT/A_kernel_times4.log $OUT/A_ab.log $OUT/A_masks.log | cut -c1-400
