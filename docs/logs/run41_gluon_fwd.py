"""Probe (run 41, not product code): the forward of the no-mask, p_scale="block" plan written in Gluon, with the
S = Q K^T wgmma of tile j issued before, and the two P V wgmmas of tile j - 1 running under, tile j's softmax and
fq(P) (the overlap that Triton 3.6's pipeliner does not give: docs/PERFORMANCE.md, eighth session).

Same math, same order of operations as ``attention_fwd_kernel`` with QUANTIZE_Q off (Q read as given), no masks,
Tq % 64 == Tk % 64 == 0, D = 128, bf16: O, O' and lse are to equal it bit for bit.

  python3 docs/logs/run41_gluon_fwd.py sass            # offline: sm_90 SASS of the Gluon kernel (no GPU)
  python3 docs/logs/run41_gluon_fwd.py bench OUT.json  # H200: bits against the Triton kernel, then times
"""

from __future__ import annotations

import json
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from jqat.kernels_triton.attention_common import LN2
from jqat.kernels_triton.nvfp4 import fq_probs


@gluon.jit
def _issue_kv(k_smem, v_smem, k_base, v_base, start_n, tk, stride_kt, stride_vt, slot, BLOCK_N: gl.constexpr,
              HEAD_DIM: gl.constexpr, LD: gl.constexpr):
  offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD))
  offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LD))
  rows = offs_n.to(gl.int64)[:, None]
  ok = (offs_n < tk)[:, None]
  async_copy.async_copy_global_to_shared(k_smem.index(slot), k_base + rows * stride_kt + offs_d[None, :], mask=ok)
  async_copy.async_copy_global_to_shared(v_smem.index(slot), v_base + rows * stride_vt + offs_d[None, :], mask=ok)
  async_copy.commit_group()


@gluon.jit
def _softmax_tile(s, m, l, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HW_E4M3: gl.constexpr,
                  HW_E2M1: gl.constexpr):
  """``_kv_tile``'s unmasked arithmetic, QUANTIZE_P, p_scale="block": new m, l, bf16 p, bf16 fq(p), alpha."""
  s = s * qk_scale
  m_new = gl.maximum(m, gl.max(s, axis=1))
  m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
  p = gl.exp2(s - m_safe[:, None])
  alpha = gl.exp2(m - m_safe)
  l = l * alpha + gl.sum(p, axis=1)
  p_fq = fq_probs(p, BLOCK_M, BLOCK_N, HW_E4M3, HW_E2M1)
  return m_new, l, p.to(gl.bfloat16), p_fq.to(gl.bfloat16), alpha


@gluon.jit
def gluon_fwd_kernel(q_ptr, k_ptr, v_ptr, qk_scale, tq, tk, n_heads,
                     stride_qb, stride_qt, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                     stride_ob, stride_ot, stride_on, o_ptr, o_hp_ptr, lse_ptr,
                     stride_kt: gl.constexpr, stride_vt: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     HW_E4M3: gl.constexpr, HW_E2M1: gl.constexpr, P_SMEM: gl.constexpr):
  stride_qb, stride_qt, stride_qn = stride_qb // 16 * 16, stride_qt // 16 * 16, stride_qn // 16 * 16
  stride_kb, stride_kn = stride_kb // 16 * 16, stride_kn // 16 * 16
  stride_vb, stride_vn = stride_vb // 16 * 16, stride_vn // 16 * 16
  stride_ob, stride_ot, stride_on = stride_ob // 16 * 16, stride_ot // 16 * 16, stride_on // 16 * 16
  tk = tk // BLOCK_N * BLOCK_N
  S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
  O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
  P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
  LD: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                      order=[1, 0])
  SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
  ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
  ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

  pid_m = gl.program_id(0)
  pid_bh = gl.program_id(1)
  b = pid_bh // n_heads
  h = pid_bh % n_heads
  start_m = pid_m * BLOCK_M

  offs_qm = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD))
  offs_qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LD))
  q = gl.load(q_ptr + b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qn
              + offs_qm.to(gl.int64)[:, None] * stride_qt + offs_qd[None, :])
  q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, HEAD_DIM], SMEM, q)
  k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], SMEM)
  v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], SMEM)
  # P_SMEM: p and fq(p) reach the P V wgmmas through shared memory (double-buffered), so the registers of the next
  # tile's softmax are free while those products run; else as register operands (ptxas then waits for the products
  # early, to reuse their operand registers: docs/BENCHMARKS.md run 41).
  p_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, BLOCK_N], SMEM)
  pfq_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, BLOCK_N], SMEM)
  k_base = k_ptr + b.to(gl.int64) * stride_kb + h.to(gl.int64) * stride_kn
  v_base = v_ptr + b.to(gl.int64) * stride_vb + h.to(gl.int64) * stride_vn
  for i in gl.static_range(STAGES - 1):
    _issue_kv(k_smem, v_smem, k_base, v_base, i * BLOCK_N, tk, stride_kt, stride_vt, i, BLOCK_N, HEAD_DIM, LD)

  m = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW_S)
  l = gl.zeros([BLOCK_M], gl.float32, ROW_S)
  acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, O_L)
  acc_hp = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, O_L)
  s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)

  # Tile 0: its S alone.
  async_copy.wait_group(STAGES - 2)
  fence_async_shared()
  gl.thread_barrier()
  s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
  s = warpgroup_mma_wait(0, deps=(s, ))
  m, l, p, p_fq, alpha = _softmax_tile(s, m, l, qk_scale, BLOCK_M, BLOCK_N, HW_E4M3, HW_E2M1)
  if P_SMEM:
    p_smem.index(0).store(p)
    pfq_smem.index(0).store(p_fq)
  _issue_kv(k_smem, v_smem, k_base, v_base, (STAGES - 1) * BLOCK_N, tk, stride_kt, stride_vt, STAGES - 1, BLOCK_N,
            HEAD_DIM, LD)

  n_tiles = tk // BLOCK_N
  for j in range(1, n_tiles):
    slot = j % STAGES
    prev = (j + STAGES - 1) % STAGES
    async_copy.wait_group(STAGES - 2)
    fence_async_shared()
    gl.thread_barrier()
    # S of tile j first, then tile j - 1's two P V products on the rescaled accumulators (the order of _kv_tile:
    # acc * alpha_{j-1} + p_{j-1} V_{j-1}); tile j's softmax and fq(P) run while the P V products do.
    s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    alpha_o = gl.convert_layout(alpha, ROW_O)
    acc_hp = acc_hp * alpha_o[:, None]
    acc = acc * alpha_o[:, None]
    if P_SMEM:
      acc_hp = warpgroup_mma(p_smem.index((j + 1) % 2), v_smem.index(prev), acc_hp, is_async=True)
      acc = warpgroup_mma(pfq_smem.index((j + 1) % 2), v_smem.index(prev), acc, is_async=True)
    else:
      acc_hp = warpgroup_mma(gl.convert_layout(p, P_L), v_smem.index(prev), acc_hp, is_async=True)
      acc = warpgroup_mma(gl.convert_layout(p_fq, P_L), v_smem.index(prev), acc, is_async=True)
    s = warpgroup_mma_wait(2, deps=(s, ))
    m, l, p, p_fq, alpha = _softmax_tile(s, m, l, qk_scale, BLOCK_M, BLOCK_N, HW_E4M3, HW_E2M1)
    if P_SMEM:
      p_smem.index(j % 2).store(p)
      pfq_smem.index(j % 2).store(p_fq)
    acc, acc_hp = warpgroup_mma_wait(0, deps=(acc, acc_hp))
    if P_SMEM:
      fence_async_shared()
    gl.thread_barrier()  # every warp's reads of slot prev are done before it is refilled
    _issue_kv(k_smem, v_smem, k_base, v_base, (j + STAGES - 1) * BLOCK_N, tk, stride_kt, stride_vt, prev, BLOCK_N,
              HEAD_DIM, LD)

  last = (n_tiles - 1) % STAGES
  if P_SMEM:  # the last tile's p (tile 0's when the loop did not run) is read by the products below
    fence_async_shared()
    gl.thread_barrier()
  alpha_o = gl.convert_layout(alpha, ROW_O)
  acc_hp = acc_hp * alpha_o[:, None]
  acc = acc * alpha_o[:, None]
  if P_SMEM:
    acc_hp = warpgroup_mma(p_smem.index((n_tiles - 1) % 2), v_smem.index(last), acc_hp, is_async=True)
    acc = warpgroup_mma(pfq_smem.index((n_tiles - 1) % 2), v_smem.index(last), acc, is_async=True)
  else:
    acc_hp = warpgroup_mma(gl.convert_layout(p, P_L), v_smem.index(last), acc_hp, is_async=True)
    acc = warpgroup_mma(gl.convert_layout(p_fq, P_L), v_smem.index(last), acc, is_async=True)
  acc, acc_hp = warpgroup_mma_wait(0, deps=(acc, acc_hp))
  async_copy.wait_group(0)

  empty = l == 0.0
  inv = gl.where(empty, 0.0, gl.div_rn(gl.full([BLOCK_M], 1.0, gl.float32, ROW_S), gl.where(empty, 1.0, l)))
  lse = gl.where(empty, float("-inf"), (m + gl.log2(gl.where(empty, 1.0, l))) * LN2)
  inv_o = gl.convert_layout(inv, ROW_O)
  empty_o = gl.convert_layout(empty, ROW_O)
  acc_hp = gl.where(empty_o[:, None], 0.0, acc_hp)
  acc = gl.where(empty_o[:, None], 0.0, acc)
  offs_m = start_m + gl.arange(0, BLOCK_M, layout=ROW_O)
  offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
  o_off = (b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_on + offs_m.to(gl.int64)[:, None] * stride_ot
           + offs_d[None, :])
  gl.store(o_hp_ptr + o_off, (acc_hp * inv_o[:, None]).to(gl.bfloat16))
  gl.store(o_ptr + o_off, (acc * inv_o[:, None]).to(gl.bfloat16))
  gl.store(lse_ptr + pid_bh.to(gl.int64) * tq + start_m + gl.arange(0, BLOCK_M, layout=ROW_S), lse)


SIGNATURE = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "qk_scale": "fp32", "tq": "i32", "tk": "i32",
    "n_heads": "i32", **{f"stride_{x}{y}": "i32" for x in "qkvo" for y in "btn" if f"{x}{y}" not in ("kt", "vt")}, "o_ptr": "*bf16",
    "o_hp_ptr": "*bf16", "lse_ptr": "*fp32",
}


def sass(stages: int = 2, p_smem: bool = True):
  import os  # noqa: PLC0415

  from triton.backends.compiler import GPUTarget  # noqa: PLC0415
  from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
  from sass_stats import ptxas_warnings, sass_stats  # noqa: PLC0415

  names = gluon_fwd_kernel.arg_names
  const = {"stride_kt": 2048, "stride_vt": 2048, "HEAD_DIM": 128, "BLOCK_M": 64, "BLOCK_N": 64, "STAGES": stages, "HW_E4M3": True, "HW_E2M1": False,
           "P_SMEM": p_smem}
  signature = {n: SIGNATURE.get(n, "constexpr") for n in names}
  attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if SIGNATURE.get(n, "").startswith("*")}
  kernel = triton.compile(GluonASTSource(gluon_fwd_kernel, signature, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=4))
  st = sass_stats(kernel)
  print(json.dumps({k: v for k, v in st.items() if k != "sass"}, indent=1))
  print("ptxas:", ptxas_warnings(kernel, 90))
  return kernel


def bench(out_path: str):
  import torch  # noqa: PLC0415

  from jqat.kernels_triton.attention_fwd import attention_fwd_kernel  # noqa: PLC0415
  from jqat.kernels_triton.nvfp4 import quant_flags  # noqa: PLC0415

  flags = quant_flags(torch.cuda.get_device_capability())
  results = []
  for (b, n, t, d) in [(1, 16, 4096, 128), (1, 16, 16384, 128), (2, 16, 8192, 128)]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, t, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = d ** -0.5
    outs = {}

    def triton_fwd(o, o_hp, lse, quantize_q=False):
      attention_fwd_kernel[(t // 64, b * n)](
          q, k, v, scale, t, t, n, 1, lse, lse, lse, lse, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
          *o.stride()[:3], o, o_hp, lse, HEAD_DIM=d, D_PAD=d, BLOCK_M=64, BLOCK_N=64, IS_CAUSAL=False,
          WINDOW_LEFT=-1, WINDOW_RIGHT=-1, BOTTOM_RIGHT=False, HAS_Q_LEN=False, HAS_KV_LEN=False, HAS_SEG=False,
          QUANTIZE_Q=quantize_q, QUANTIZE_P=True, QK_F32=False, DOT_BF16=True, SOFT_BF16=False, DOT_PREC="tf32",
          SEQ_ALIGN=16, num_warps=4, num_stages=3, **flags)

    def gluon_fwd(o, o_hp, lse, stages=2, p_smem=True):
      gluon_fwd_kernel[(t // 64, b * n)](
          q, k, v, scale * 1.4426950408889634, t, t, n, *q.stride()[:3], k.stride(0), k.stride(2), v.stride(0),
          v.stride(2), *o.stride()[:3], o, o_hp, lse, stride_kt=k.stride(1), stride_vt=v.stride(1), HEAD_DIM=d, BLOCK_M=64, BLOCK_N=64, STAGES=stages, P_SMEM=p_smem, num_warps=4,
          **flags)

    variants = {"triton": triton_fwd, "gluon_psmem_2": lambda *a: gluon_fwd(*a, stages=2),
                "gluon_preg_2": lambda *a: gluon_fwd(*a, stages=2, p_smem=False),
                "gluon_preg_3": lambda *a: gluon_fwd(*a, stages=3, p_smem=False),
                "triton_again": triton_fwd,
                "triton_own_q": lambda *a: triton_fwd(*a, quantize_q=True)}  # the no-mask plan: rounds Q itself
    for name, fn in variants.items():
      o, o_hp = torch.empty_like(q), torch.empty_like(q)
      lse = torch.empty(b, n, t, device="cuda", dtype=torch.float32)
      fn(o, o_hp, lse)
      torch.cuda.synchronize()
      outs[name] = (o, o_hp, lse)
      ms = triton.testing.do_bench(lambda fn=fn, o=o, o_hp=o_hp, lse=lse: fn(o, o_hp, lse), warmup=50, rep=300)
      row = {"shape": [b, n, t, d], "kernel": name, "ms": ms}
      if name not in ("triton", "triton_own_q"):
        ref = outs["triton"]
        row["bits_equal"] = {nm: bool(torch.equal(x.view(torch.int16) if x.dtype == torch.bfloat16 else x.view(
            torch.int32), y.view(torch.int16) if y.dtype == torch.bfloat16 else y.view(torch.int32)))
            for nm, x, y in zip(("O", "O'", "lse"), outs[name], ref)}
        row["max_abs_diff"] = {nm: float((x.float() - y.float()).abs().max())
                               for nm, x, y in zip(("O", "O'", "lse"), outs[name], ref)}
      print(json.dumps(row), flush=True)
      results.append(row)
  with open(out_path, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  if sys.argv[1] == "sass":
    sass(int(sys.argv[2]) if len(sys.argv) > 2 else 2, len(sys.argv) <= 3 or sys.argv[3] == "smem")
  else:
    bench(sys.argv[2])
