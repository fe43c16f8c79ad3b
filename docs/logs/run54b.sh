# Run 54b (session 23): the primal forward's launch configurations (docs/logs/run54b_fwdcfg.py). Carry .device.
source .device/setup.sh
timeout 400 python3 docs/logs/run54b_fwdcfg.py $OUT/run54b_fwdcfg.json 2>&1 | grep -v -i warn > $OUT/run54b_fwdcfg.log
echo "elapsed $SECONDS s"
