# Run 49a (prepared in session 19, not yet run): the kept tree's numbers for the two open issues, in one call.
# Issue 12: the masks benchmark (packed documents, the window of 1024 at 16k; forward and given-dO fwd+bwd against
# their baselines), after run 47b's descriptors on the masked walks. Issue 13: the rows of its table that run 48c did
# not retake (2-6: 16k, 16k causal with FastVideo, D = 64, video, GQA), after the scratch pool and run 47c.
# Carry .device (with fastvideo_kernel-0.3.5.tar.gz back in it: it was moved out of .device in session 19 to keep
# the carry under 64 MiB; drop the .tar trees first).
source .device/setup.sh
timeout 150 python3 benchmarks/masks.py --out $OUT/run49a_masks.json > $OUT/run49a_masks.log 2>&1
echo "rc $? elapsed $SECONDS s" >> $OUT/run49a_masks.log
grep -v -i warn $OUT/run49a_masks.log | tail -8
timeout $((590 - SECONDS)) python3 benchmarks/attention.py --rows 2,3,4,5,6 \
  --fastvideo-sdist .device/fastvideo_kernel-0.3.5.tar.gz --fastvideo-shapes 3 --iters 10 --repeats 5 \
  --out $OUT/run49a_attention.json > $OUT/run49a_attention.log 2>&1
echo "rc $? elapsed $SECONDS s" >> $OUT/run49a_attention.log
grep -v -i warn $OUT/run49a_attention.log | tail -14
