# Run 47b (prepared in session 18, not yet run): the forward's K/V by TMA on every walk, not only the unmasked loop
# (docs/logs/run47_tma_all.patch: the descriptors' row bound becomes kv_lim, so a copy fills a ragged tail with zeros
# as the masked loads do; the window's walk and the masked tiles take them too; same gate: D_PAD = 128, and 256
# without segment ids). Why: the window's forward (issue 12) walks all its tiles in the masked loop, which run 46
# did not touch. Offline (sm_90a): the window's loop 1087 -> 1039 instructions per iteration at D = 128; every
# D = 128 case of docs/logs/run46_fwd_scan.py without spills (16-112 B before), no serialized kernel. Under the
# interpreter: O, O', lse bitwise equal to this tree's in 6 masked / ragged cases (docs/logs/run47_interp_bits.py),
# and tests/test_nan.py tests/test_masks.py tests/test_attention_triton.py tests/test_callback_launch.py pass.
# Build the trees here first (carry .device):
#   git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml docs/logs > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t \
#     && patch -d /tmp/t -p1 -s < docs/logs/run47_tma_all.patch && tar -cf .device/tma_all.tar -C /tmp/t .
source .device/setup.sh
for t in main tma_all; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=16384:window1024,16384:packed1024,16384:packed_causal1024,16384:causal,4096:full,4096:causal_d256
for t in main tma_all main tma_all; do
  (cd /tmp/$t && JQAT_CACHE_DIR=/tmp/$t/.jc PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run37_configs.py \
    fwd $C default 2>&1 | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/run47b_kernels.log)
  echo "elapsed $SECONDS s"
done
for t in main tma_all; do
  (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run35_bits_hash.py $OUT/run47b_h_$t.json \
    > $OUT/run47b_h_$t.log 2>&1)
done
python3 -c "
import json
a, b = json.load(open('$OUT/run47b_h_main.json')), json.load(open('$OUT/run47b_h_tma_all.json'))
for k in a: print(k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/run47b_bits.log
(cd /tmp/tma_all && PYTHONPATH=/tmp/site:/tmp/tma_all timeout $((580 - SECONDS)) python3 -m pytest -q -m gpu \
  tests/test_masks.py tests/test_nan.py > $OUT/run47b_gpu_tests.log 2>&1)
tail -3 $OUT/run47b_gpu_tests.log
echo "elapsed $SECONDS s"
