#!/usr/bin/env bash
source .device/setup.sh 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/K_env.log
S=benchmarks/attention_sweep.py
timeout 200 python3 $S --seq 16384 --kinds bwd --only 6,7 --iters 5 --repeats 5 --json $OUT/K_16k.json 2>&1 | grep -v Warn | tail -8 | tee $OUT/K_16k.log
timeout 120 python3 $S --seq 4096 --kinds bwd --only 6,7 --json $OUT/K_4k.json 2>&1 | grep -v Warn | tail -8 | tee $OUT/K_4k.log
timeout 120 python3 $S --seq 4096 --head_dim 64 --kinds bwd --only 6,7 --json $OUT/K_4k_d64.json 2>&1 | grep -v Warn | tail -8 | tee $OUT/K_4k_d64.log
timeout 120 python3 $S --seq 8192 --heads 32 --kv_heads 8 --causal yes --kinds bwd --only 6,7 --json $OUT/K_gqa.json 2>&1 | grep -v Warn | tail -6 | tee $OUT/K_gqa.log
