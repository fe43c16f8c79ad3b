# Run 44c: what the access pattern alone costs (the kernel's loads and stores without arithmetic, with and
# without the cache gather, and as whole rows) against the kernel and a copy; then the benchmark of record,
# now alternating the op and the copy (5 rounds), on this tree.
source .device/setup.sh
python3 docs/logs/run44_rope_ab.py $OUT/run44c_rope_io.json now,io_tiles,io_rows,io_tiles_gather 2>&1 | tee $OUT/run44c_rope_io.log
python3 benchmarks/torch_rope_qdq.py --out $OUT/run44c_torch_rope_qdq.json 2>&1 | tee $OUT/run44c_torch_rope_qdq.log
