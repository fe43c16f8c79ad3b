# Run 47c (prepared in session 18, not yet run): qkv_scale="tensor" above D = 128 with fq(enc * Q) from the pass
# (docs/logs/run47_tensor_qpass.patch). Offline, ptxas serializes the wgmma of that mode's forward at D = 144-256 on
# main (the kernel rounds its own Q tile there); with the pass, no case of D = 144-256 is serialized. At D = 128, the
# pass with p_scale="row" and causal made Triton 3.6's ptxas crash (SIGSEGV), so the gate is D > 128. Under the
# interpreter the forward's bits equal main's (docs/logs/run47_interp_bits_tensor.py). Per kernel through JAX, main /
# patched alternated twice, then the bits on the GPU, then the numerics-mode GPU tests on the patched tree.
# Build the trees here first (carry .device):
#   git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml docs/logs > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t \
#     && patch -d /tmp/t -p1 -s < docs/logs/run47_tensor_qpass.patch && tar -cf .device/tensor_qpass.tar -C /tmp/t .
source .device/setup.sh
for t in main tensor_qpass; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=4096:tensor_d192,4096:tensor_causal_d256,16384:tensor_causal_d128
for t in main tensor_qpass main tensor_qpass; do
  (cd /tmp/$t && JQAT_CACHE_DIR=/tmp/$t/.jc PYTHONPATH=/tmp/site:/tmp/$t timeout 120 python3 docs/logs/run37_configs.py \
    fwd $C default 2>&1 | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/run47c_kernels.log)
  echo "elapsed $SECONDS s"
done
for t in main tensor_qpass; do
  (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t:/tmp/$t/tests timeout 100 python3 docs/logs/run47_interp_bits_tensor.py \
    $OUT/run47c_h_$t.json --gpu > $OUT/run47c_h_$t.log 2>&1)
done
python3 -c "
import json
a, b = json.load(open('$OUT/run47c_h_main.json')), json.load(open('$OUT/run47c_h_tensor_qpass.json'))
print({k: a[k] == b[k] for k in a})
" 2>&1 | tee $OUT/run47c_bits.log
(cd /tmp/tensor_qpass && PYTHONPATH=/tmp/site:/tmp/tensor_qpass timeout $((580 - SECONDS)) python3 -m pytest -q -m gpu \
  tests/test_numerics_modes_triton.py > $OUT/run47c_gpu_tests.log 2>&1)
tail -3 $OUT/run47c_gpu_tests.log
echo "elapsed $SECONDS s"
