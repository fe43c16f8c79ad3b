# Run 49c (prepared in session 19, not yet run): the dQ kernel, two patches. (1) run49_dq_window_wide.patch: with a
# window above D_PAD = 128 the dQ kernel takes the three walks of the other masks instead of the window's single walk,
# which made ptxas serialize every wgmma of that kernel at every D from 144 to 256 (offline, main:
# docs/logs/run49_dq_scan_main.log; patched: docs/logs/run49_dq_scan_window_wide.log). (2) run49_dq_tma.patch on top:
# dQ's K/V tiles by TMA descriptors (bounded by kv_lim, every walk, at D_PAD = 128 and at 256 without segment ids),
# as the forward's; offline its loops are 498 -> 451 (window), 290 -> 275 / 360 -> 317 (no mask), 502 -> 462 (causal
# masked) instructions per iteration and its registers 220 -> 173 / 246 -> 185 (docs/logs/run49_dq_scan_tma.log:
# builds everywhere, serialized only where main is). Under the interpreter both keep the bits
# (docs/logs/run49_interp_bits_bwd.py). Not for landing as is: the torch binding's prepared backward promises that
# execute allocates nothing, and the descriptors' scratch would have to come from its workspace.
# (The device returns at most 8 files per call: this script writes 7.) Per kernel through JAX, main / window_wide /
# dq_tma alternated twice, then the bits, then the dQ-relevant GPU tests
# on dq_tma. Build the trees here first (carry .device; move the .tar trees of older runs out of it first):
#   git archive HEAD jqat kernels_triton ffi benchmarks tests pyproject.toml docs/logs > .device/main.tar
#   rm -rf /tmp/t && mkdir /tmp/t && tar -xf .device/main.tar -C /tmp/t \
#     && patch -d /tmp/t -p1 -s < docs/logs/run49_dq_window_wide.patch && tar -cf .device/window_wide.tar -C /tmp/t . \
#     && patch -d /tmp/t -p1 -s < docs/logs/run49_dq_tma.patch && tar -cf .device/dq_tma.tar -C /tmp/t .
source .device/setup.sh
for t in main window_wide dq_tma; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t; done
C=16384:window1024,8192:window1024_d192,8192:window1024_d256,16384:full,16384:causal
for t in main window_wide dq_tma main window_wide dq_tma; do
  (cd /tmp/$t && JQAT_CACHE_DIR=/tmp/$t/.jc PYTHONPATH=/tmp/site:/tmp/$t timeout 100 python3 docs/logs/run37_configs.py \
    bwd $C default 2>&1 | grep -v -i warn | sed "s/^/$t /" | tee -a $OUT/run49c_kernels.log)
  echo "elapsed $SECONDS s"
done
for t in main window_wide dq_tma; do
  (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 150 python3 docs/logs/run49_bits_hash.py $OUT/run49c_h_$t.json \
    >> $OUT/run49c_h.log 2>&1) &
done
wait
python3 -c "
import json
a = json.load(open('$OUT/run49c_h_main.json'))
for t in ('window_wide', 'dq_tma'):
  b = json.load(open(f'$OUT/run49c_h_{t}.json'))
  for k in a: print(t, k, {n: 'same' if a[k][n] == b[k][n] else 'DIFF' for n in a[k]})
" 2>&1 | tee $OUT/run49c_bits.log
(cd /tmp/dq_tma && PYTHONPATH=/tmp/site:/tmp/dq_tma timeout $((580 - SECONDS)) python3 -m pytest -q -m gpu \
  tests/test_masks.py tests/test_nan.py > $OUT/run49c_gpu_tests.log 2>&1)
tail -3 $OUT/run49c_gpu_tests.log
echo "elapsed $SECONDS s"
