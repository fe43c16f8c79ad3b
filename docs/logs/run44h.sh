# Run 44h: one cache row per position id (HEADS constexpr) against the default (aa2ed14's kernel), and the benchmark of
# record on this tree (512384a's product code).
source .device/setup.sh
python3 docs/logs/run44_rope_ab.py $OUT/run44h_rope_ab.json now_w4,heads_w4,tiles 2>&1 | grep -v "bitwise equal to now: True" | tee $OUT/run44h_rope_ab.log
python3 benchmarks/torch_rope_qdq.py --out $OUT/run44h_torch_rope_qdq.json 2>&1 | tee $OUT/run44h_torch_rope_qdq.log
