#!/usr/bin/env bash
# Run 36b: JAX vs torch binding, the same forward: wall and per-kernel device time.
# JQAT_FWD_Q_PASS, JQAT_SEQ_ALIGN and JQAT_Q_IN_REGS were switches of the experimental tree of this run only
# (ffi/plan.py); the final tree has none of them (docs/BENCHMARKS.md, run 36).
source .device/setup.sh
which nsys ncu > $OUT/B_tools.txt 2>&1
timeout 150 python3 docs/logs/run36_jax_vs_torch.py 16384 > $OUT/B_jax_vs_torch_16k.log 2>&1
timeout 100 python3 docs/logs/run36_jax_vs_torch.py 4096 > $OUT/B_jax_vs_torch_4k.log 2>&1
cat $OUT/B_tools.txt; grep -v Warn $OUT/B_jax_vs_torch_16k.log | cut -c1-300; grep -v Warn $OUT/B_jax_vs_torch_4k.log | cut -c1-300
