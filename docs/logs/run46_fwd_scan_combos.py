"""Offline ptxas builds of the forward (docs/logs/run46_fwd_scan.py's check) over more cases; run from the repository
root of the tree to scan: python3 docs/logs/run46_fwd_scan_combos.py"""
import sys
sys.argv = [sys.argv[0], "__none__"]
exec(open("docs/logs/run46_fwd_scan.py").read().split("\nfor d in range(16, 257, 16):")[0])
sys.argv = [sys.argv[0]]
for d in (80, 128, 192, 256):
  for mode, mkw in (("row", dict(p_scale="row")), ("tensor", dict(qkv_scale="tensor")),
                    ("row+tensor", dict(p_scale="row", qkv_scale="tensor")), ("plain", {})):
    for mname, masks, kw in (("causal", (), dict(is_causal=True)), ("lens causal", ("q_len", "kv_len"), dict(is_causal=True)),
                             ("segments causal", ("q_seg", "kv_seg"), dict(is_causal=True)),
                             ("lens", ("q_len", "kv_len"), {}), ("gqa", (), dict()), ("fp16 causal", (), dict(is_causal=True))):
      extra = dict(heads=32, kvh=8) if mname == "gqa" else {}
      if mname.startswith("fp16"):
        extra["dtype"] = "float16"
      check(f"{mode} {mname} d{d}", d=d, masks=masks, **kw, **mkw, **extra)
