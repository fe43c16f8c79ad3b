"""What run 44's RoPE-QDQ variants share: kernels_triton/rope_qdq.py at 4946c85, whose helpers they were measured
with (`git show 4946c85:kernels_triton/rope_qdq.py > .device/rope_qdq_head.py`, as run44_rope_ab.py also loads it)."""

import importlib.util

_spec = importlib.util.spec_from_file_location("rope_qdq_4946c85", ".device/rope_qdq_head.py")
rope_4946c85 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rope_4946c85)
