"""Offline ptxas builds of the forward (docs/logs/run46_fwd_scan.py's check) over more cases; run from the repository
root of the tree to scan: python3 docs/logs/run47_scan_tensor.py"""
import sys
sys.argv = [sys.argv[0], "__none__"]
exec(open("docs/logs/run46_fwd_scan.py").read().split("\nfor d in range(16, 257, 16):")[0])
sys.argv = [sys.argv[0]]
for d in (64, 80, 96, 112, 128, 144, 160, 192, 208, 256):
  check(f"tensor d{d}", d=d, qkv_scale="tensor")
  check(f"tensor row causal d{d}", d=d, qkv_scale="tensor", p_scale="row", is_causal=True)
check("tensor segments d128", d=128, qkv_scale="tensor", masks=("q_seg", "kv_seg"))
check("tensor window d128", d=128, qkv_scale="tensor", is_causal=True, local_window_size=(1023, 0))
check("tensor segments d256", d=256, qkv_scale="tensor", masks=("q_seg", "kv_seg"))
