#!/usr/bin/env bash
# Run 38e: the XLA reference of qkv_scale="tensor" on the GPU against the CPU backend (before the fix).
source .device/setup.sh; timeout 200 python3 docs/logs/run38_tensor_ref_gpu.py 2>&1 | grep -v -i warn | tee $OUT/E_tensor_ref_gpu.log
