source .device/setup.sh
# Run 42e: the rest of run42's bit cases on the kept tree (42d's 60 s box ended in fp32_dense's compile),
# then the JAX-vs-torch bitwise tests.
rm -rf /tmp/t_final && mkdir -p /tmp/t_final && tar -xf .device/final.tar -C /tmp/t_final
PYTHONPATH=/tmp/site:/tmp/t_final timeout 150 python3 docs/logs/run42_bits_hash.py $OUT/E_h42_final.json \
  fp32_dense,d64_causal,row_dense,tensor_causal 2>&1 | grep -v -i warn | tee $OUT/E_h42_final.log
(cd /tmp/t_final && PYTHONPATH=/tmp/site:/tmp/t_final timeout $((250 - SECONDS)) python3 -m pytest -q \
  -p no:cacheprovider -rfE -m gpu tests/test_torch.py -k bitwise) > $OUT/E_tests.log 2>&1; tail -3 $OUT/E_tests.log
echo "elapsed $SECONDS s"
