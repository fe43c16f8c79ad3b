# Run 44k: the final tree (nvfp4.corrected_quotient): the GPU tests of RoPE-QDQ, the torch binding and the NVFP4
# kernels (the quotient path against the threshold tree for every E4M3 scale), and the benchmark of record.
source .device/setup.sh
python3 -m pytest -q -m gpu tests/test_rope_qdq.py tests/test_torch.py tests/test_nvfp4_triton.py > $OUT/run44k_gpu_tests.log 2>&1; tail -2 $OUT/run44k_gpu_tests.log
python3 benchmarks/torch_rope_qdq.py --out $OUT/run44k_torch_rope_qdq.json 2>&1 | tee $OUT/run44k_torch_rope_qdq.log
