source .device/setup.sh
# Run 43e: a second sample of issue 13's two no-mask D = 128 rows (run 43c: 1.99x, 1.96x) on the committed tree.
t=final; rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xf .device/$t.tar -C /tmp/$t
(cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t timeout 200 python3 benchmarks/ab_attention.py --iters 10 \
  --repeats 7 --shapes 0,4,0,4 --cudnn --out $OUT/E_ab.json 2>&1 | grep -v -i warn) > $OUT/E_ab.log; cat $OUT/E_ab.log
echo "elapsed $SECONDS s"
