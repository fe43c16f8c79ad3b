"""sha256 of the Triton kernels' outputs under TRITON_INTERPRET=1 (CPU, torch binding) for windowed and packed
masks at small sizes: forward (O, O', lse) and backward (dQ, dK, dV). Compare two trees' prints.
  TRITON_INTERPRET=1 python run37_interp_bits.py"""
import hashlib, os, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "tests")
import test_attention_triton  # noqa: F401  (its numpy-2 patch of Triton 3.6's interpreter)
import torch
from jqat.ffi import plan as plans, torch_launch
from jqat.ffi.options import AttentionOptions, QATConfig
from jqat.kernels_triton.attention_bwd import BackwardConfig
from jqat.kernels_triton.attention_fwd import ForwardConfig

def h(t):
  return hashlib.sha256(t.detach().float().numpy().tobytes()).hexdigest()[:16]

CASES = {"window_causal": (True, (40, 0), False), "window_sym": (False, (20, 13), False),
         "segments_causal": (True, None, True)}
for name, (causal, window, seg) in CASES.items():
  g = torch.Generator().manual_seed(3)
  t, d = 160, 16
  q, k, v, do = (torch.randn(1, t, 2, d, generator=g).to(torch.bfloat16) for _ in range(4))
  opts = AttentionOptions(d ** -0.5, causal, 16, QATConfig(), window, "top_left")
  masks_t = (None, None) + ((torch.arange(t, dtype=torch.int32)[None] // 50,) * 2 if seg else (None, None))
  masks_d = tuple(None if m is None else torch_launch.describe(m) for m in masks_t)
  present = {n: m for n, m in zip(("q_len", "kv_len", "q_seg", "kv_seg"), masks_t) if m is not None}
  plan = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), opts, torch_launch.target(q),
                                 config=ForwardConfig(16, 4, 1), masks=masks_d)
  ft = dict(q=q, k=k, v=v, **present)
  for nm in plan.scratch + plan.outputs:
    b = plan.buffers[nm]
    ft[nm] = torch.full(b.shape, float("nan"), dtype=getattr(torch, b.dtype)) if "float" in b.dtype or "bfloat" in b.dtype else torch.zeros(b.shape, dtype=getattr(torch, b.dtype))
  torch_launch.execute(plan, ft)
  plan = plans.attention_backward(*map(torch_launch.describe, (do, q, k, v, ft["o_hp"], ft["lse"])), opts,
                                  torch_launch.target(q), config=BackwardConfig(16, 16, 4, 1, 16, 16, 4, 1),
                                  masks=masks_d)
  bt = dict(do=do, q=q, k=k, v=v, o_for_delta=ft["o_hp"], lse=ft["lse"], **present)
  for nm in plan.scratch + plan.outputs:
    b = plan.buffers[nm]
    if nm not in bt:
      bt[nm] = torch.full(b.shape, float("nan"), dtype=getattr(torch, b.dtype)) if "float" in b.dtype or "bfloat" in b.dtype else torch.zeros(b.shape, dtype=getattr(torch, b.dtype))
  torch_launch.execute(plan, bt)
  print(name, {n: h(x) for n, x in (("O", ft["o"]), ("O'", ft["o_hp"]), ("lse", ft["lse"]), ("dQ", bt["dq"]),
                                     ("dK", bt["dk"]), ("dV", bt["dv"]))}, flush=True)
