# Run 45a: issue 13's table with every column, FastVideo's included (its 0.3.5 sdist carried in .device/, sha256
# checked by benchmarks/fastvideo.py), on main (git archive HEAD, .device/main.tar).
source .device/setup.sh
R=$PWD
rm -rf /tmp/main && mkdir -p /tmp/main && tar -xf .device/main.tar -C /tmp/main
cd /tmp/main && PYTHONPATH=/tmp/site:/tmp/main timeout 540 python3 benchmarks/attention.py \
  --fastvideo-sdist $R/.device/fastvideo_kernel-0.3.5.tar.gz --iters 10 --repeats 5 \
  --out $OUT/run45a_attention.json > $OUT/run45a_attention.log 2>&1
echo "rc $? elapsed $SECONDS s" >> $OUT/run45a_attention.log
grep -v -i warn $OUT/run45a_attention.log | tail -40
