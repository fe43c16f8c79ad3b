#!/usr/bin/env bash
# Run 40d (one H200: no two-GPU machine was lent; the checkout of run 40c): the Triton path under jit / vmap /
# determinism, Flax on the GPU (default implementation: Triton, through the VJP that keeps fq(X)), the callback
# launcher's GPU tests, then torch.
source .device/setup.sh
timeout 250 python3 -m pytest -q -p no:cacheprovider -rf -m gpu tests/test_attention_triton.py \
  -k "vmap or jit or determin" > $OUT/D_attention.log 2>&1
tail -2 $OUT/D_attention.log; echo "attention elapsed $SECONDS s"
timeout $((440 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_flax.py tests/test_callback_launch.py \
  tests/test_torch.py > $OUT/D_flax_callback_torch.log 2>&1
tail -2 $OUT/D_flax_callback_torch.log; echo "elapsed $SECONDS s"
