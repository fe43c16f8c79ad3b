#!/usr/bin/env bash
# Run 37d: launch-config sweep at D = 64 on the current kernels (issue 13's D = 64 row is the furthest from its target).
source .device/setup.sh
timeout 280 python3 benchmarks/attention_sweep.py --seq 4096 --head_dim 64 --causal no --budget_s 230 --json $OUT/D_sweep_d64.json 2>&1 | grep -v -i warn | tail -16 | tee $OUT/D_sweep_d64.log
