# Run 44a: RoPE-QDQ variants (persistent / prefetching loops) against the kernel now, and ncu at real clocks.
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm > $OUT/run44a_gpu.txt
python3 docs/logs/run44_rope_ab.py $OUT/run44a_rope_ab.json now,persist2_k4,persist3_k4,persist2_w4_k8,prefetch_k2,prefetch_w4_k4,prefetch_w4_k5 2>&1 | tee $OUT/run44a_rope_ab.log
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" > $OUT/run44a_rope_ncu.log
timeout 200 $NCU --clock-control none -k regex:rope_qdq_kernel --launch-skip 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section LaunchStats \
  python3 docs/logs/run44_rope_ncu.py fp4/32/ue8m0 128 1 now,prefetch_k2,persist2_k4 >> $OUT/run44a_rope_ncu.log 2>&1
echo "rc $?" >> $OUT/run44a_rope_ncu.log
