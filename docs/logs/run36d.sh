#!/usr/bin/env bash
# Run 36d: forward variants through JAX (SEQ_ALIGN on): in-kernel fq(Q) (A), Q pass + Q in registers (B), Q pass (C).
# JQAT_FWD_Q_PASS, JQAT_SEQ_ALIGN and JQAT_Q_IN_REGS were switches of the experimental tree of this run only
# (ffi/plan.py); the final tree has none of them (docs/BENCHMARKS.md, run 36).
source .device/setup.sh
for cfg in "A 0 0" "B 1 1" "C 1 0"; do
  set -- $cfg
  for c in "16384 full" "16384 causal" "4096 full" "4096 causal" "16384 window:1024" "4096 full 64 2"; do
    JQAT_FWD_Q_PASS=$2 JQAT_Q_IN_REGS=$3 timeout 60 python3 docs/logs/run36_jax_kernels.py $c 2>/dev/null | sed "s/^/$1 /" >> $OUT/D_jax_kernels.log
  done
done
cat $OUT/D_jax_kernels.log | python3 -c "
import sys, json
for l in sys.stdin:
  tag, js = l.split(' ', 1); d = json.loads(js)
  print(tag, d['S'], d['case'], d['D'], d['B'], 'fwd %.4f f+b %.4f' % (d['fwd_ms'], d['fwd_bwd_ms']), 'kern', d['fwd_kernels'], 'bwd', {k: v for k, v in d['fwd_bwd_kernels'].items() if 'bwd' in k})
"
