source .device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 400 python3 docs/logs/run41_gluon_fwd.py bench $OUT/B_gluon.json 2>&1 | grep -v -i warn | tee $OUT/B_gluon.log
echo "elapsed $SECONDS s"
