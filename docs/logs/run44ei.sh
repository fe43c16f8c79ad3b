# Runs 44e, 44f, 44i, 44j, 44l and 44m were single commands on the warm machine (after `source .device/setup.sh`):
# 44e: python3 docs/logs/run44_rope_host.py $OUT/run44e_rope_host.json | tee $OUT/run44e_rope_host.log
# 44f: python3 docs/logs/run44_rope_host_split.py | tee $OUT/run44f_rope_host_split.log
# 44i: python3 benchmarks/torch_rope_qdq.py --out $OUT/run44i_torch_rope_qdq.json | tee $OUT/run44i_torch_rope_qdq.log
# 44j: python3 -m pytest -q -m gpu tests/test_rope_qdq.py tests/test_torch.py > $OUT/run44j_gpu_tests.log
#      (on the tree of 512384a, the same as runs 44h and 44i)
# 44l: python3 benchmarks/torch_rope_qdq.py --sweep 2048:2:2,4096:2:2,2048:4:2,8192:8:2,4096:4:3 \
#        --out $OUT/run44l_rope_sweep.json | tee $OUT/run44l_rope_sweep.log
# 44m: on the final tree with launch_config's width-128 programs at 2048 channels (uncommitted, then reverted):
#      python3 benchmarks/torch_rope_qdq.py --out $OUT/run44m_torch_rope_qdq.json | tee $OUT/run44m_torch_rope_qdq.log;
#      python3 -m pytest -q -m gpu tests/test_rope_qdq.py > $OUT/run44m_rope_tests.log
