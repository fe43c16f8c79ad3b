# Run 52a (prepared in session 21, not yet run). Carry .device. Writes 6 files.
# (1) docs/logs/run52_maxnreg.py: the O-alone forward at D <= 64 with Triton's maxnreg=128 (four programs per SM
#     instead of three, offline no spill in the loops at 3 stages), through the torch binding, bits hashed.
# (2) the GPU tests that session 21's device time did not reach on e16d13c (the forward at D <= 64 on 64 rows /
#     4 warps): the D = 128-256 cases of tests/test_attention_triton.py (10 of 23; the other 13 passed in runs
#     51c/51d), then the rest of the GPU suite in what is left of the box.
source .device/setup.sh
timeout 180 python3 docs/logs/run52_maxnreg.py $OUT/run52a_maxnreg.json 2>&1 | grep -v -i warn > $OUT/run52a_maxnreg.log
cat $OUT/run52a_maxnreg.log | cut -c1-220; echo "elapsed $SECONDS s"
# (1b) the same cap through JAX (the launch-config field; it caps the residual forward too: offline, at 168 that
# one's wgmma were serialized, so read its column with care)
timeout 150 python3 docs/logs/run51_d64.py $OUT/run52a_d64.json default maxnreg=128 2>&1 | grep -v -i warn \
  > $OUT/run52a_d64.log; echo "elapsed $SECONDS s"
timeout 240 python3 -m pytest -q -rs -m gpu tests/test_attention_triton.py \
  -k "not D64 and not -64- and not -48- and not deterministic and not vmap_and_jit" > $OUT/run52a_attention.log 2>&1
tail -2 $OUT/run52a_attention.log; echo "elapsed $SECONDS s"
timeout $((570 - SECONDS)) python3 -m pytest -q -rs -m gpu tests/test_nvfp4_triton.py tests/test_rope_qdq.py \
  tests/test_qat_matmul.py tests/test_nvfp4_pallas.py tests/test_bench_numerics.py tests/test_grad_fidelity.py \
  tests/test_ffi.py tests/test_flax.py > $OUT/run52a_rest.log 2>&1
tail -2 $OUT/run52a_rest.log; echo "elapsed $SECONDS s"
