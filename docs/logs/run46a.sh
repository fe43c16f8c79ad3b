# Run 46a (prepared in session 17, not yet run): the forward's and the dK/dV kernel's tile loads through TMA tensor
# descriptors (docs/logs/run46_tma.patch: the forward's unmasked K/V tiles, dK/dV's unmasked Q and dO tiles; the
# torch binding gives Triton's launcher an allocator for the descriptors' global scratch) against main, through the
# JAX binding (jax-triton 0.3.1; since 3b011b1 ffi/triton_call.py hands jaxlib's TritonKernel the global scratch
# size that jax-triton drops: 256 bytes per program for either kernel), then the bits, then the GPU tests of both
# bindings on the patched tree. The two kernels are different launches: one A/B measures each.
# Why: Nsight Compute (run 45c) put 27% of dK/dV's stall samples on the Q / dO tiles' 64-bit addresses and 16-byte
# LDGSTS copies, and about 12% of the forward's on the integer work where it issues the next K/V tile's copies. Offline (sm_90 SASS, python3
# benchmarks/sass_stats.py): dK/dV's unmasked loop 648 -> 620 instructions (IMAD 52 -> 22, LEA 18 -> 2, LDGSTS
# 24 -> 16, 2 UTMALDG); the forward's unmasked loop 930 -> 889 at D = 128 (causal too), 1066 -> 975 at D = 256 (its
# stack 176 -> 32 B), 824 -> 823 at D = 64. Not covered: the JAX callback launcher (JQAT_JAX_LAUNCHER=callback) has no
# allocator for the scratch, so its GPU tests are not in this run.
# Build the trees here first (carry .device):
#   git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml docs/logs > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t \
#     && patch -d /tmp/t -p1 -s < docs/logs/run46_tma.patch && tar -cf .device/tma.tar -C /tmp/t .
source .device/setup.sh
for t in main tma; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=16384:full,4096:full,16384:causal,8192:gqa_causal,4096:full_d64,16384:window1024
for t in main tma main tma; do
  PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 /tmp/$t/docs/logs/run37_configs.py bwd $C default 2>&1 \
    | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/run46a_kernels.log
  echo "elapsed $SECONDS s"
done
for t in main tma; do
  (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run35_bits_hash.py $OUT/run46a_h_$t.json \
    > $OUT/run46a_h_$t.log 2>&1)
done
python3 -c "
import json
a, b = json.load(open('$OUT/run46a_h_main.json')), json.load(open('$OUT/run46a_h_tma.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/run46a_bits.log
echo "elapsed $SECONDS s"
(cd /tmp/tma && PYTHONPATH=/tmp/site:/tmp/tma timeout $((580 - SECONDS)) python3 -m pytest -q -m gpu \
  tests/test_attention_triton.py tests/test_torch.py tests/test_masks.py tests/test_nan.py > $OUT/run46a_gpu_tests.log 2>&1)
tail -3 $OUT/run46a_gpu_tests.log
echo "elapsed $SECONDS s"
