"""Launch plans (``jqat/ffi/plan.py``) and their two executors: the JAX binding and the torch binding.

Both bindings must launch exactly what the plan says; the kernels themselves are checked
against the reference in tests/test_attention_triton.py. Nothing here runs a kernel: the
JAX binding's jax-triton call and the kernels' launchers are replaced by recorders.
"""

import dataclasses
import inspect
import re

import jax.numpy as jnp
import pytest
import torch
from conftest import load_bench

from jqat.ffi import jax_launch, torch_launch
from jqat.ffi import plan as plans
from jqat.ffi.options import P_ROW_RANGE, AttentionOptions, QATConfig
from jqat.kernels_triton import attention_bwd as kbwd
from jqat.kernels_triton import attention_fwd as kfwd

GPU = plans.Target((9, 0))


def _bhsd_views(b, h, hkv, sq, skv, d):
  """BTNH views of contiguous BHSD tensors, as the torch shim passes them."""
  mk = lambda *s: torch.zeros(*s, dtype=torch.bfloat16).transpose(1, 2)
  return mk(b, h, sq, d), mk(b, hkv, skv, d), mk(b, hkv, skv, d)


def test_plan_uses_the_strides_it_is_given(monkeypatch):
  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "triton")  # the Triton forward's arguments (sm_90 takes the Gluon one)
  q, k, v = _bhsd_views(2, 8, 2, 100, 70, 128)
  lse = torch.zeros(2, 8, 100)
  opts = AttentionOptions(0.1, True)
  fwd = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), opts, GPU, out_strides=q.stride())
  # Causal: the pass quantizes Q too, and the forward kernel reads fq(Q) (QUANTIZE_Q off).
  # One launch quantizes all three (jqat/ffi/plan.py _fake_quantize).
  assert [la.name for la in fwd.launches] == ["jqat_nvfp4_fake_quantize_qkv", "jqat_attention_fwd"]
  assert fwd.launches[0].outputs == ("q_hat", "k_hat", "v_hat") and fwd.launches[0].args[3:] == (1600, 280, 280, 128)
  args = fwd.launches[-1].args
  assert args[:3] == (plans.Ref("q_hat"), plans.Ref("k_hat"), plans.Ref("v_hat"))
  assert not fwd.launches[-1].constexprs["QUANTIZE_Q"] and fwd.launches[-1].constexprs["SEQ_ALIGN"] == 1
  # after 5 mask args, 3 encode-scale placeholders and the NaN flags' (read in REDO mode only)
  assert args[17:29] == q.stride()[:3] + k.stride()[:3] + v.stride()[:3] + q.stride()[:3]
  assert fwd.buffers["q_hat"].strides == q.stride() and fwd.buffers["k_hat"].strides == k.stride()
  assert fwd.scratch == ("q_hat", "k_hat", "v_hat")
  # Without causal or window masks, at D <= 32, the forward kernel rounds its own Q tile.
  nq, nk, nv = _bhsd_views(2, 8, 2, 100, 70, 32)
  dense = plans.attention_forward(*map(torch_launch.describe, (nq, nk, nv)),
                                  dataclasses.replace(opts, is_causal=False), GPU, out_strides=nq.stride())
  assert dense.scratch == ("k_hat", "v_hat") and dense.launches[-1].args[0] == plans.Ref("q")
  assert dense.launches[-1].constexprs["QUANTIZE_Q"]
  # At 32 < D <= 64 fq(Q) comes from the pass, and O alone (no residuals) then fits a cap of 128 registers.
  for d in (48, 64):
    mq, mk, mv = map(torch_launch.describe, _bhsd_views(2, 8, 2, 100, 70, d))
    for residuals, cap in ((True, 0), (False, 128)):
      mid = plans.attention_forward(mq, mk, mv, dataclasses.replace(opts, is_causal=False), GPU, residuals=residuals)
      assert mid.scratch == ("q_hat", "k_hat", "v_hat") and not mid.launches[-1].constexprs["QUANTIZE_Q"]
      assert mid.launches[-1].maxnreg == cap
  # At 64 < D <= 128 that kernel spills in its loop (with the quotient rounding of E2M1): fq(Q) from the pass.
  d128 = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), dataclasses.replace(opts, is_causal=False),
                                 GPU, out_strides=q.stride())
  assert d128.scratch == ("q_hat", "k_hat", "v_hat") and not d128.launches[-1].constexprs["QUANTIZE_Q"]
  # Above D = 128 the kernel's own Q rounding left too few registers (ptxas serialized its wgmma): fq(Q) from
  # the pass, masks or not.
  wq, wk, wv = _bhsd_views(2, 8, 2, 100, 70, 192)
  wide = plans.attention_forward(*map(torch_launch.describe, (wq, wk, wv)), dataclasses.replace(opts, is_causal=False),
                                 GPU, out_strides=wq.stride())
  assert wide.scratch == ("q_hat", "k_hat", "v_hat") and not wide.launches[-1].constexprs["QUANTIZE_Q"]
  # Packed documents: the kernel that rounds its own Q spilled in every loop; fq(Q) from the pass.
  seg_q, seg_k = plans.Tensor.dense((2, 100), "int32"), plans.Tensor.dense((2, 70), "int32")
  packed = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), dataclasses.replace(opts, is_causal=False),
                                   GPU, out_strides=q.stride(), masks=(None, None, seg_q, seg_k))
  assert packed.scratch[:3] == ("q_hat", "k_hat", "v_hat") and not packed.launches[-1].constexprs["QUANTIZE_Q"]
  bwd = plans.attention_backward(*map(torch_launch.describe, (q, q, k, v, q, lse)), opts, GPU)
  assert [bwd.buffers[n].strides for n in ("dq", "dk", "dv")] == [q.stride(), k.stride(), v.stride()]
  key_tiles = -(-70 // plans.backward_config(128).kv_block_n)  # the dK/dV grid: key tiles x (batch, KV head)
  assert bwd.scratch == ("q_hat", "delta") and bwd.launches[-1].grid == (key_tiles, 2 * 2)
  # fq(K), fq(V) live in dk's and dv's storage: the dK/dV launch reads them in place, after the dQ launch.
  dkdv = bwd.launches[-1]
  assert bwd.stored_in == {"k_hat": "dk", "v_hat": "dv"} and [la.name for la in bwd.launches[-2:]] == [
      "jqat_attention_bwd_dq", "jqat_attention_bwd_dkdv"]
  assert [(dkdv.args[i], dkdv.outputs[o]) for i, o in dkdv.aliases] == [(plans.Ref("k_hat"), "dk"),
                                                                         (plans.Ref("v_hat"), "dv")]
  off = dataclasses.replace(opts, config=QATConfig(quantize_qkv=False))
  assert plans.attention_forward(*map(torch_launch.describe, (q, k, v)), off, GPU).scratch == ()


def test_jax_backward_plan_writes_fq_q_over_o_prime():
  """``q_hat_over_out`` (the JAX binding): the delta launch also writes fq(Q), over O''s storage (aliased), and
  the dQ and dK/dV launches read it there; plans it cannot apply to keep fq(Q) in scratch."""
  q = plans.Tensor.dense((2, 100, 8, 128), "bfloat16")
  k = plans.Tensor.dense((2, 70, 2, 128), "bfloat16")
  lse = plans.Tensor.dense((2, 8, 100), "float32")
  opts = AttentionOptions(0.1, True)
  bwd = plans.attention_backward(q, q, k, k, q, lse, opts, GPU, q_hat_over_out=True)
  assert [la.name for la in bwd.launches] == ["jqat_nvfp4_fake_quantize_kv", "jqat_attention_bwd_delta_fq",
                                              "jqat_attention_bwd_dq", "jqat_attention_bwd_dkdv"]
  delta, dq, dkdv = bwd.launches[-3:]
  assert bwd.scratch == ("delta",) and bwd.stored_in == {"k_hat": "dk", "v_hat": "dv", "q_hat": "o_for_delta"}
  assert [(delta.args[i], delta.outputs[o]) for i, o in delta.aliases] == [(plans.Ref("o_for_delta"), "q_hat")]
  assert delta.kernel is kbwd.attention_bwd_delta_fq_kernel and bwd.buffers["q_hat"] == q
  assert dq.args[0] == dkdv.args[0] == plans.Ref("q_hat")
  _assert_signatures(bwd)
  # O' laid out unlike Q, qkv_scale="tensor", or no quantization: fq(Q) (if any) stays in scratch.
  o_t = plans.Tensor((2, 100, 8, 128), "bfloat16", (102400, 1, 12800, 100))
  for o, op in ((o_t, opts), (q, dataclasses.replace(opts, qkv_scale="tensor")),
                (q, dataclasses.replace(opts, config=QATConfig(quantize_qkv=False)))):
    plan = plans.attention_backward(q, q, k, k, o, lse, op, GPU, q_hat_over_out=True)
    assert "q_hat" not in plan.stored_in and "jqat_attention_bwd_delta" in [la.name for la in plan.launches]


def test_empty_problems_fill_instead_of_launching():
  q, k, v = _bhsd_views(1, 2, 1, 5, 0, 16)
  plan = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), AttentionOptions(0.25), GPU)
  assert plan.launches == () and plan.fills == {"o": 0.0, "o_hp": 0.0, "lse": float("-inf")}


@pytest.mark.parametrize("tq,tk,align", [(128, 64, 16), (100, 64, 1), (128, 70, 1)])
def test_lengths_divisible_by_16_are_shown_to_the_kernels(tq, tk, align):
  """SEQ_ALIGN = 16 exactly when both lengths are multiples of 16 (the forward and dQ kernels then write them as
  ``t // 16 * 16``, the hint Triton's own launcher gives and jax-triton does not); the dK/dV kernel takes none."""
  q = plans.Tensor.dense((1, tq, 4, 64), "bfloat16")
  k = plans.Tensor.dense((1, tk, 4, 64), "bfloat16")
  lse = plans.Tensor.dense((1, 4, tq), "float32")
  opts = AttentionOptions(0.125, True)
  fwd = plans.attention_forward(q, k, k, opts, GPU)
  bwd = {la.name: la for la in plans.attention_backward(q, q, k, k, q, lse, opts, GPU).launches}
  assert fwd.launches[-1].constexprs["SEQ_ALIGN"] == align == bwd["jqat_attention_bwd_dq"].constexprs["SEQ_ALIGN"]
  dkdv = [la for name, la in bwd.items() if name.startswith("jqat_attention_bwd_dkdv")]  # the Triton or ws (+ REDO)
  assert dkdv and all("SEQ_ALIGN" not in la.constexprs for la in dkdv)


def test_fake_quantize_needs_dense_rows():
  q = torch.zeros(2, 8, 32, 64, dtype=torch.bfloat16)[:, :, ::2].transpose(1, 2)  # gaps between rows
  with pytest.raises(ValueError, match="dense tensor"):
    plans.attention_forward(*(torch_launch.describe(q),) * 3, AttentionOptions(0.1), GPU)


def _recorded_plan(plan):
  """The plan with every kernel replaced by a recorder of its launches."""
  calls = []

  class Kernel:
    def __init__(self, name):
      self.name = name

    def __getitem__(self, grid):
      return lambda *args, **kwargs: calls.append((self.name, grid, args, kwargs))

  launches = tuple(dataclasses.replace(la, kernel=Kernel(la.name)) for la in plan.launches)
  return dataclasses.replace(plan, launches=launches), calls


def _assert_signatures(plan):
  """Every launch passes exactly its kernel's runtime parameters (args, then outputs) and its constexprs."""
  for la in plan.launches:
    params = inspect.signature(la.kernel.fn).parameters.values()  # the Python function of a JIT or interpreted kernel
    constexprs = {p.name for p in params if "constexpr" in str(p.annotation)}
    given = len(la.args) + len(la.outputs)
    # The parameters after those are constexprs: the annotated ones and any absent output (None).
    assert set(la.constexprs) == {p.name for p in list(params)[given:]} >= constexprs, la.name


def _tensor_plans(p_scale, masks=plans.NO_MASKS, d=64):
  q, k, v = _bhsd_views(2, 4, 2, 33, 40, d)
  lse = torch.zeros(2, 4, 33)
  opts = AttentionOptions(0.125, p_scale=p_scale, qkv_scale="tensor")
  row_max = plans.Tensor.dense((2, 4, 33), "float32") if p_scale == "row" else None
  fwd = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), opts, GPU, masks=masks)
  bwd = plans.attention_backward(*map(torch_launch.describe, (q, q, k, v, q, lse)), opts, GPU, masks=masks,
                                 row_max=row_max)
  return fwd, bwd


@pytest.mark.parametrize("p_scale", ["block", "row"])
def test_tensor_scale_plans(p_scale):
  """qkv_scale="tensor": encode scales of Q, K, V (amax over the lengths that apply), fq(enc * X), then the
  kernels reading the scales (QKV_TENSOR); the "block" plans keep their launches and kernels."""
  kv_len = plans.Tensor.dense((2,), "int32")
  fwd, bwd = _tensor_plans(p_scale, masks=(None, kv_len, None, None))
  scales = ["jqat_nvfp4_tensor_scale_q", "jqat_nvfp4_tensor_scale_k", "jqat_nvfp4_tensor_scale_v"]
  assert [la.name for la in fwd.launches] == scales + ["jqat_nvfp4_fake_quantize_scaled_k",
                                                       "jqat_nvfp4_fake_quantize_scaled_v", "jqat_attention_fwd"]
  row = ["jqat_attention_bwd_row_factors"] if p_scale == "row" else []  # R * l, 1 / (R * l) per query row
  assert [la.name for la in bwd.launches] == scales + [f"jqat_nvfp4_fake_quantize_scaled_{n}" for n in "qkv"] + [
      "jqat_attention_bwd_delta", *row, "jqat_attention_bwd_dq", "jqat_attention_bwd_dkdv"]
  assert fwd.scratch == ("q_enc", "k_enc", "v_enc", "k_hat", "v_hat")
  assert bwd.scratch == ("q_enc", "k_enc", "v_enc", "q_hat", "delta") + ("row_factors",) * (p_scale == "row")
  assert bwd.stored_in == {"k_hat": "dk", "v_hat": "dv"}
  assert fwd.launches[-1].kernel is kfwd.attention_fwd_kernel and fwd.launches[-1].constexprs["QKV_TENSOR"]
  assert (bwd.launches[-2].kernel, bwd.launches[-1].kernel) == (kbwd.attention_bwd_dq_kernel,
                                                                kbwd.attention_bwd_dkdv_kernel)
  assert bwd.launches[-2].constexprs["QKV_TENSOR"] and bwd.launches[-1].constexprs["QKV_TENSOR"]
  enc = (plans.Ref("q_enc"), plans.Ref("k_enc"), plans.Ref("v_enc"))
  assert fwd.launches[-1].args[13:16] == enc and bwd.launches[-2].args[16:19] == enc
  # Q's amax runs over all rows (no query_seq_lengths here), K's and V's over the first kv_len keys.
  lens = [(la.args[1], la.constexprs["HAS_LEN"], la.grid) for la in fwd.launches[:3]]
  assert lens == [(plans.Ref("q"), False, (8,)), (plans.Ref("kv_len"), True, (4,)), (plans.Ref("kv_len"), True, (4,))]
  assert fwd.buffers["q_enc"] == plans.Tensor.dense((2, 4), "float32")
  assert fwd.buffers["k_hat"].strides == fwd.buffers["k"].strides  # BHSD views: scratch keeps the strides
  for plan in (fwd, bwd):
    _assert_signatures(plan)
  # Above D = 128, fq(enc * Q) comes from the pass with K and V, and the forward kernel reads it (QUANTIZE_Q off).
  assert fwd.launches[-1].constexprs["QUANTIZE_Q"]
  for d, q_pass in ((128, False), (144, True), (256, True)):
    wide, _ = _tensor_plans(p_scale, d=d)
    hats = [la.name for la in wide.launches if "fake_quantize_scaled" in la.name]
    assert hats == [f"jqat_nvfp4_fake_quantize_scaled_{n}" for n in ("qkv" if q_pass else "kv")], d
    assert wide.launches[-1].args[0] == plans.Ref("q_hat" if q_pass else "q"), d
    assert wide.launches[-1].constexprs["QUANTIZE_Q"] is not q_pass, d
    _assert_signatures(wide)
  # Without quantization the scale mode changes nothing; "block" plans launch the kernels of docs/NUMERICS.md, 4.
  q, k, v = _bhsd_views(2, 4, 2, 33, 40, 64)
  for opts in (AttentionOptions(0.125, p_scale=p_scale), AttentionOptions(0.125, p_scale=p_scale, qkv_scale="tensor",
                                                                          config=QATConfig(quantize_qkv=False))):
    block = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), opts, GPU)
    assert all("enc" not in name for name in block.buffers)
    assert block.launches[-1].kernel is kfwd.attention_fwd_kernel
    assert not block.launches[-1].constexprs["QKV_TENSOR"]
    _assert_signatures(block)
  lse = torch.zeros(2, 4, 33)
  row_max = plans.Tensor.dense((2, 4, 33), "float32") if p_scale == "row" else None
  block = plans.attention_backward(*map(torch_launch.describe, (q, q, k, v, q, lse)),
                                   AttentionOptions(0.125, p_scale=p_scale), GPU, row_max=row_max)
  assert (block.launches[-2].kernel, block.launches[-1].kernel) == (kbwd.attention_bwd_dq_kernel,
                                                                    kbwd.attention_bwd_dkdv_kernel)
  _assert_signatures(block)


@pytest.mark.parametrize("qkv_scale", ["block", "tensor"])
def test_torch_binding_launches_the_plan(qkv_scale):
  q, k, v = _bhsd_views(1, 4, 2, 33, 40, 64)
  lse = torch.zeros(1, 4, 33)
  plan = plans.attention_backward(*map(torch_launch.describe, (q, q, k, v, q, lse)),
                                  AttentionOptions(0.125, qkv_scale=qkv_scale), GPU)
  plan, calls = _recorded_plan(plan)
  tensors = dict(do=q, q=q, k=k, v=v, o_for_delta=q, lse=lse, **torch_launch.allocate(plan, plan.scratch + plan.outputs,
                                                                                     "cpu"))
  torch_launch.execute(plan, tensors)
  assert [c[0] for c in calls] == [la.name for la in plan.launches]
  tensors.update({name: tensors[out] for name, out in plan.stored_in.items()})  # fq(K), fq(V) in dk, dv
  for (_, grid, args, kwargs), la in zip(calls, plan.launches):
    assert grid == la.grid
    want = [tensors[a.name] if isinstance(a, plans.Ref) else a for a in la.args] + [tensors[o] for o in la.outputs]
    assert len(args) == len(want) and all(a is w for a, w in zip(args, want))
    assert kwargs == dict(la.constexprs, num_warps=la.num_warps, num_stages=la.num_stages)


def test_workspace_carves_aligned_disjoint_scratch():
  q, k, v = _bhsd_views(1, 4, 2, 33, 40, 64)
  lse = torch.zeros(1, 4, 33)
  plan = plans.attention_backward(*map(torch_launch.describe, (q, q, k, v, q, lse)), AttentionOptions(0.125), GPU)
  ws = torch.zeros(torch_launch.workspace_bytes(plan), dtype=torch.uint8)
  views = torch_launch.carve(plan, ws)
  spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in views.values())
  assert all((lo - ws.data_ptr()) % 256 == 0 for lo, _ in spans) and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
  assert spans[-1][1] <= ws.data_ptr() + ws.numel()
  assert all(views[n].stride() == plan.buffers[n].strides for n in plan.scratch)


@pytest.mark.parametrize("qkv_scale", ["block", "tensor"])
def test_jax_binding_launches_the_plan(monkeypatch, qkv_scale):
  calls = []

  def fake_triton_call(*args, kernel, out_shape, grid, num_warps, num_stages, input_output_aliases, name, maxnreg,
                       **meta):
    calls.append(dict(args=args, kernel=kernel, grid=grid, num_warps=num_warps, num_stages=num_stages,
                      aliases=input_output_aliases, name=name, maxnreg=maxnreg, meta=meta))
    outs = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    res = tuple(jnp.zeros(o.shape, o.dtype) for o in outs)
    return res if isinstance(out_shape, tuple) else res[0]

  monkeypatch.setattr(jax_launch, "triton_call", fake_triton_call)
  q = jnp.zeros((2, 100, 8, 128), jnp.bfloat16)
  k = jnp.zeros((2, 70, 2, 128), jnp.bfloat16)
  plan = plans.attention_forward(*map(jax_launch.dense, (q, k, k)), AttentionOptions(0.1, True, qkv_scale=qkv_scale),
                                 GPU)
  outs = jax_launch.execute(plan, q, k, k)
  assert [o.shape for o in outs] == [q.shape, q.shape, (2, 8, 100)]
  assert [c["name"] for c in calls] == [la.name for la in plan.launches]
  for c, la in zip(calls, plan.launches):
    assert c["kernel"] is la.kernel and c["grid"] == la.grid and c["meta"] == la.constexprs
    # aliases: (array operand, output) pairs, the array operands numbered without the scalars
    refs = [i for i, a in enumerate(la.args) if isinstance(a, plans.Ref)]
    assert c["aliases"] == {refs.index(i): o for i, o in la.aliases}
    assert (c["num_warps"], c["num_stages"], c["maxnreg"]) == (la.num_warps, la.num_stages, la.maxnreg)
    assert [a for a in c["args"] if not hasattr(a, "shape")] == [a for a in la.args if not isinstance(a, plans.Ref)]
  # In-place rope: the aliased input is numbered among the array operands, scalars skipped.
  x = jnp.zeros((4, 2, 128), jnp.bfloat16)
  rope = plans.rope_qdq(jax_launch.dense(x), plans.Tensor.dense((8, 64), "float32"), plans.Tensor.dense((4,), "int32"),
                        GPU, heads=2, group=32, fp8=False, e4m3_scale=False, amax_floor=6 * 2.0**-126)
  jax_launch.execute(rope, x, jnp.zeros((8, 64), jnp.float32), jnp.zeros((4,), jnp.int32))
  assert calls[-1]["aliases"] == {0: 0}


def test_quantize_pass_drops_its_masks_only_for_whole_tiles():
  """EVEN (no bounds masks in the quantize pass) only where every tile is whole: rows a multiple of BLOCK_R and D
  of BLOCK_C. 2 x 100 x 8 rows of Q fill tiles of 16; 2 x 70 x 2 rows of K and V do not; D = 80 never does."""
  for d, want in ((128, {"q": True, "k": False, "v": False}), (80, {"q": False, "k": False, "v": False})):
    q, k, v = _bhsd_views(2, 8, 2, 100, 70, d)
    fwd = plans.attention_forward(*map(torch_launch.describe, (q, k, v)), AttentionOptions(0.1, True), GPU,
                                  out_strides=q.stride())
    (launch,) = [la for la in fwd.launches if "fake_quantize" in la.name]  # one launch for the three
    even = {name: launch.constexprs[f"EVEN{i}"] for i, name in enumerate("qkv")}
    assert even == want, (d, even)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_reads_the_forwards_quantized_inputs(causal):
  """keep_quantized: the forward returns the fq(K), fq(V) its passes wrote, and the backward given them launches no
  quantize pass for them, reads them as they are and overwrites them with dK, dV in place (aliases); fq(Q) still
  comes from the delta launch, over O''s storage."""
  q, k, v = (jnp.zeros(s, jnp.bfloat16) for s in ((2, 100, 8, 128), (2, 70, 2, 128), (2, 70, 2, 128)))
  opts = AttentionOptions(0.1, causal)
  kept = plans.kept_quantized(opts)
  assert kept == ("k", "v") and plans.kept_quantized(AttentionOptions(0.1, causal, qkv_scale="tensor")) == ()
  fwd = plans.attention_forward(*map(jax_launch.dense, (q, k, v)), opts, GPU, keep_quantized=True)
  assert fwd.outputs == ("o", "o_hp", "lse", "k_hat", "v_hat") and not {"k_hat", "v_hat"} & set(fwd.scratch)
  assert plans.attention_forward(*map(jax_launch.dense, (q, k, v)), opts, GPU).outputs == ("o", "o_hp", "lse")
  bwd = plans.attention_backward(*map(jax_launch.dense, (q, q, k, v, q)), plans.Tensor.dense((2, 8, 100), "float32"),
                                 opts, GPU, q_hat_over_out=True, quantized=kept)
  _assert_signatures(bwd)
  assert not [la.name for la in bwd.launches if "fake_quantize" in la.name]
  delta, dq, dkdv = bwd.launches
  assert delta.kernel is kbwd.attention_bwd_delta_fq_kernel and bwd.stored_in == {"q_hat": "o_for_delta"}
  assert dq.args[:3] == (plans.Ref("q_hat"), plans.Ref("k"), plans.Ref("v"))
  assert {(dkdv.args[i].name, dkdv.outputs[o]) for i, o in dkdv.aliases} == {("k", "dk"), ("v", "dv")}
  assert bwd.scratch == ("delta",)
  with pytest.raises(ValueError, match="quantized names inputs among k, v"):
    plans.attention_backward(*map(jax_launch.dense, (q, q, k, v, q)), plans.Tensor.dense((2, 8, 100), "float32"),
                             AttentionOptions(0.1, causal, qkv_scale="tensor"), GPU, quantized=("k", "v"))
  with pytest.raises(ValueError, match="quantized names inputs among k, v"):
    plans.attention_backward(*map(jax_launch.dense, (q, q, k, v, q)), plans.Tensor.dense((2, 8, 100), "float32"),
                             opts, GPU, quantized=("q",))


def test_windowed_backward_takes_the_window_dq_config(monkeypatch):
  """With a local window the dQ launch (D = 128) has 64 rows on 4 warps and 2 stages, without one the
  default 128 rows on 8 warps; the environment still overrides either."""
  q = plans.Tensor.dense((1, 300, 4, 128), "bfloat16")
  lse = plans.Tensor.dense((1, 4, 300), "float32")

  def dq_launch(**kw):
    plan = plans.attention_backward(q, q, q, q, q, lse, AttentionOptions(0.1, True, **kw), GPU)
    (dq,) = [la for la in plan.launches if la.name == "jqat_attention_bwd_dq"]
    return dq.constexprs["BLOCK_M"], dq.num_warps, dq.num_stages

  assert dq_launch(local_window_size=(127, 0)) == (64, 4, 2)
  assert dq_launch() == (128, 8, 3)
  monkeypatch.setenv("JQAT_ATTN_BWD_CONFIG", "dq_num_stages=3")
  assert dq_launch(local_window_size=(127, 0)) == (64, 4, 3)


@pytest.mark.parametrize("p_scale,qkv_scale", [("block", "block"), ("row", "block"), ("block", "tensor"),
                                               ("row", "tensor")])
def test_forward_without_residuals(p_scale, qkv_scale):
  """residuals=False (the primal of jqat.attention): O is the only output and nothing else is allocated for it; the
  launches before the forward kernel are the residual plan's, the kernel is the forward with RESIDUALS off
  with the residual kernel's arguments up to O and its constexprs, P_ROW_RANGE 0 for "block"."""
  q, k, v = (plans.Tensor.dense(s, "bfloat16") for s in ((2, 33, 4, 64), (2, 40, 2, 64), (2, 40, 2, 64)))
  kv_len = plans.Tensor.dense((2,), "int32")
  opts = AttentionOptions(0.125, True, p_scale=p_scale, qkv_scale=qkv_scale)
  masks = (None, kv_len, None, None)
  full = plans.attention_forward(q, k, v, opts, GPU, masks=masks)
  out = plans.attention_forward(q, k, v, opts, GPU, masks=masks, residuals=False)
  assert out.outputs == ("o",) and set(out.buffers) == set(full.buffers) - {"o_hp", "lse", "row_max"}
  assert out.scratch == full.scratch and out.launches[:-1] == full.launches[:-1]
  fwd, ref = out.launches[-1], full.launches[-1]
  assert fwd.kernel is ref.kernel is kfwd.attention_fwd_kernel
  assert (fwd.args, fwd.outputs, fwd.grid) == (ref.args, ("o",), ref.grid)
  assert fwd.constexprs == {**ref.constexprs, "RESIDUALS": False, "o_hp_ptr": None, "lse_ptr": None, "m_ptr": None}
  assert fwd.constexprs["P_ROW_RANGE"] == (plans.P_ROW_RANGE if p_scale == "row" else 0.0)
  empty = plans.attention_forward(plans.Tensor.dense((2, 0, 4, 64), "bfloat16"), k, v, opts, GPU, residuals=False)
  assert (empty.outputs, empty.launches, empty.fills) == (("o",), (), {"o": 0.0})
  with pytest.raises(ValueError, match="keep_quantized needs residuals"):
    plans.attention_forward(q, k, v, opts, GPU, keep_quantized=True, residuals=False)


def _plain_build(plan, launch):
  """Builds a launch of ``plan`` for sm_90 (its arguments' types as the launchers give them)."""
  from jqat.ffi import callback_launch

  types = tuple("*" + callback_launch._POINTER_TYPES[plan.buffers[a.name].dtype] if isinstance(a, plans.Ref)
                else "fp32" if isinstance(a, float) else "i32" for a in launch.args)
  types += tuple("*" + callback_launch._POINTER_TYPES[plan.buffers[o].dtype] for o in launch.outputs)
  return callback_launch.build(launch.kernel, types, (), tuple(launch.constexprs.items()), launch.num_warps,
                               launch.num_stages, (9, 0), maxnreg=launch.maxnreg)


def _warp_specialized_build(plan, launch, tmp_path, loops=False):
  """Builds a warp-specialized Gluon launch of ``plan`` for sm_90 and returns cuobjdump's resource usage of it (with
  ``loops``: and its SASS loops with their instruction mix, ``benchmarks/sass_stats.py``'s), after checking its
  warps: 12 in all (a consumer warpgroup by default, one more and the producer's)."""
  import subprocess

  import triton

  kernel = _plain_build(plan, launch)
  assert kernel.metadata.num_warps == 12
  path = tmp_path / "k.cubin"
  path.write_bytes(kernel.asm["cubin"])
  cuobjdump = str(triton.__path__[0]) + "/backends/nvidia/bin/cuobjdump"
  usage = subprocess.run([cuobjdump, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
  if not loops:
    return usage
  return usage, load_bench("sass_stats").sass_stats(kernel)["loops"]


def _walk_local_ops(loops: list, hgmma: int) -> dict:
  """Local-memory loads and stores (spill traffic) in the ws dK/dV consumers' walk: the shortest loop issuing
  ``hgmma`` wgmma instructions, D / 8 + BLOCK_M / 8 per query tile."""
  walks = [lp for lp in loops if lp["mix"].get("HGMMA") == hgmma]
  assert walks, "no loop issues the walk's wgmma"
  walk = min(walks, key=lambda lp: lp["instructions"])
  return {op: walk["mix"].get(op, 0) for op in ("LDL", "STL")}


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_ws_forward_lookahead_builds_asynchronous_for_sm90(monkeypatch, tmp_path):
  """The warp-specialized forward's LOOKAHEAD build of O alone (S_{j+1} issued before tile j's softmax; the unmasked
  walk two tiles an iteration, so that the product in flight is never a register move's operand) builds for sm_90
  without spills and with its wgmma asynchronous: ptxas notes no serialization, and the two-tile loop issues its 24
  wgmma (8 for each S, 4 for each P V) behind 12 warpgroup arrives and waits, where a serialized build waits after
  every wgmma."""
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "ws")
  dense = plans.Tensor.dense
  q, kv = dense((1, 256, 4, 128), "bfloat16"), dense((1, 256, 2, 128), "bfloat16")
  plan = plans.attention_forward(q, kv, kv, AttentionOptions(0.088), GPU, residuals=False)
  launch = dataclasses.replace(plan.launches[-1], constexprs=dict(plan.launches[-1].constexprs, LOOKAHEAD=True))
  usage, loops = _warp_specialized_build(plan, launch, tmp_path, loops=True)
  assert re.search(r"STACK:0\b", usage), usage
  pairs = [lp for lp in loops if lp["mix"].get("HGMMA") == 24]
  assert pairs and all(lp["mix"]["WARPGROUP"] <= 12 for lp in pairs), [lp["mix"] for lp in loops]
  assert load_bench("sass_stats").ptxas_warnings(_plain_build(plan, launch), 90) == []


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_ws_forward_plan_builds_for_sm90(monkeypatch, tmp_path):
  """Without a mask by default (the same plan as ``JQAT_ATTN_FWD_KERNEL=ws``) the O-alone forward ends in the
  warp-specialized Gluon kernel on fq(Q), fq(K), fq(V) from the pass (lse to scratch), also at lengths its tiles do not
  divide, and the training forward in its RESIDUALS build (O, O', lse); both build for sm_90 with their worker warps (12
  in all) and no spills. A causal walk (the default's from WS_CAUSAL_MIN_ROWS rows, ``ws``'s at any length) is followed
  by the Triton kernel's REDO launch over the outputs in place (it builds too). A case the warp-specialized kernel does
  not take, and ``JQAT_ATTN_FWD_KERNEL=triton``, keep the Triton kernel; an unknown value is a ValueError naming the
  variable. Row mode and D = 96 (tiles of 128 channels) take it too."""
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  monkeypatch.delenv(plans.FWD_KERNEL_ENV, raising=False)
  dense = plans.Tensor.dense
  q, kv = dense((1, 256, 4, 128), "bfloat16"), dense((1, 256, 2, 128), "bfloat16")
  plan = plans.attention_forward(q, kv, kv, AttentionOptions(0.088), GPU, residuals=False)
  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "ws")
  assert plans.attention_forward(q, kv, kv, AttentionOptions(0.088), GPU, residuals=False) == plan
  assert [la.name for la in plan.launches] == ["jqat_nvfp4_fake_quantize_qkv", "jqat_attention_fwd_ws"]
  launch = plan.launches[-1]
  assert launch.grid == (2, 4) and launch.outputs == ("o", "lse_ws", "fwd_leaks")
  assert plan.outputs == ("o",) and {"lse_ws", "fwd_leaks"} <= set(plan.scratch)
  assert plan.buffers["fwd_leaks"].shape == (1,)  # a placeholder: only a causal walk writes its flags
  usage = _warp_specialized_build(plan, launch, tmp_path)
  assert re.search(r"STACK:0\b", usage), usage
  # Causal: the causal build (heads fastest in the grid), then the Triton launch in REDO mode over O in place,
  # reading the flags of 64-row tiles.
  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "triton")
  causal_opts = AttentionOptions(0.088, is_causal=True)
  triton_causal = plans.attention_forward(q, kv, kv, causal_opts, GPU, residuals=False).launches[-1]
  # The default: the Triton kernel on causal walks of fewer than WS_CAUSAL_MIN_ROWS rows, the warp-specialized one from
  # there.
  monkeypatch.delenv(plans.FWD_KERNEL_ENV)
  assert plans.attention_forward(q, kv, kv, causal_opts, GPU, residuals=False).launches[-1] == triton_causal
  rows = plans.WS_CAUSAL_MIN_ROWS
  long_q, long_kv = dense((1, rows, 4, 128), "bfloat16"), dense((1, rows, 2, 128), "bfloat16")
  long_causal = plans.attention_forward(long_q, long_kv, long_kv, causal_opts, GPU, residuals=False)
  assert [la.name for la in long_causal.launches[-2:]] == ["jqat_attention_fwd_ws", "jqat_attention_fwd_redo"]
  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "ws")  # the warp-specialized kernel wherever it takes the launch
  causal = plans.attention_forward(q, kv, kv, causal_opts, GPU, residuals=False)
  ws, redo = causal.launches[-2:]
  assert ws.name == "jqat_attention_fwd_ws" and ws.constexprs["IS_CAUSAL"] and ws.grid == (4, 2)
  assert causal.buffers["fwd_leaks"].shape == (4, 4) and "fwd_leaks" in causal.scratch
  assert redo.kernel is kfwd.attention_fwd_kernel and redo.constexprs == dict(triton_causal.constexprs, REDO=True)
  assert redo.grid == triton_causal.grid == (4, 4) and redo.outputs == ("o",)
  refs = lambda la: [a.name if isinstance(a, plans.Ref) else a for a in la.args]
  changed = [(i, x, y) for i, (x, y) in enumerate(zip(refs(triton_causal), refs(redo), strict=True)) if x != y]
  assert [(x, y) for _, x, y in changed] == [("q", "o"), ("q_hat", "fwd_leaks")], changed
  assert redo.aliases == ((changed[0][0], 0),)
  _plain_build(causal, redo)
  # The training forward (O, O', lse for a backward): the same kernel with RESIDUALS, lse an output, nothing new kept
  # besides fq(K), fq(V) where asked; causal, REDO writes all three in place.
  training = plans.attention_forward(q, kv, kv, AttentionOptions(0.088), GPU, keep_quantized=True)
  ws = training.launches[-1]
  assert ws.name == "jqat_attention_fwd_ws" and ws.constexprs["RESIDUALS"] and "o_hp_ptr" not in ws.constexprs
  assert ws.outputs == ("o", "lse", "fwd_leaks", "o_hp") and training.outputs == ("o", "o_hp", "lse", "k_hat", "v_hat")
  assert "lse_ws" not in training.buffers and training.scratch == ("q_hat", "fwd_leaks")
  assert re.search(r"STACK:0\b", _warp_specialized_build(training, ws, tmp_path)), "training"
  training_causal = plans.attention_forward(q, kv, kv, causal_opts, GPU)
  redo = training_causal.launches[-1]
  assert redo.constexprs["REDO"] and redo.constexprs["RESIDUALS"] and redo.outputs == ("o", "o_hp", "lse")
  assert [(refs(redo)[i], o) for i, o in redo.aliases] == [("o", 0), ("o_hp", 1), ("lse", 2)]
  # Lengths that are not multiples of its tiles: the last row block and key tile partial.
  ragged = plans.attention_forward(dense((1, 200, 4, 128), "bfloat16"), dense((1, 150, 2, 128), "bfloat16"),
                                   dense((1, 150, 2, 128), "bfloat16"), AttentionOptions(0.088), GPU, residuals=False)
  assert ragged.launches[-1].name == "jqat_attention_fwd_ws" and ragged.launches[-1].grid == (2, 4)
  # Row mode: the row max a fourth output, which the causal walk's REDO launch writes in place as well; D = 96 on
  # tiles of 128 channels. (Both built offline by benchmarks/attention_ws.py --compile-only.)
  row_opts = AttentionOptions(0.088, is_causal=True, p_scale="row")
  row = plans.attention_forward(q, kv, kv, row_opts, GPU)
  ws, redo = row.launches[-2:]
  assert ws.constexprs["P_ROW_RANGE"] == P_ROW_RANGE and ws.constexprs["RESIDUALS"] and "m_ptr" not in ws.constexprs
  assert ws.outputs == ("o", "lse", "fwd_leaks", "o_hp", "row_max") and row.outputs == ("o", "o_hp", "lse", "row_max")
  assert redo.constexprs["REDO"] and redo.outputs == row.outputs
  assert [(refs(redo)[i], o) for i, o in redo.aliases] == [("o", 0), ("o_hp", 1), ("lse", 2), ("row_max", 3)]
  row_alone = plans.attention_forward(q, kv, kv, dataclasses.replace(row_opts, is_causal=False), GPU, residuals=False)
  assert row_alone.launches[-1].constexprs["P_ROW_RANGE"] == P_ROW_RANGE and row_alone.outputs == ("o",)
  assert row_alone.launches[-1].constexprs["m_ptr"] is None
  d96 = dense((1, 256, 4, 96), "bfloat16"), dense((1, 256, 2, 96), "bfloat16")
  ws96 = plans.attention_forward(d96[0], d96[1], d96[1], AttentionOptions(0.1), GPU, residuals=False).launches[-1]
  assert ws96.name == "jqat_attention_fwd_ws" and (ws96.constexprs["HEAD_DIM"], ws96.constexprs["D_PAD"]) == (96, 128)
  # A case the warp-specialized kernel does not take keeps the Triton kernel: D = 64, a window, a causal mask aligned
  # bottom-right with Tq != Tk (the kernel's is top-left).
  for qs, ks, opts in (((1, 128, 4, 128), (1, 256, 2, 128),
                        AttentionOptions(0.088, is_causal=True, causal_alignment="bottom_right")),
                       ((1, 256, 4, 64), (1, 256, 2, 64), AttentionOptions(0.125)),
                       ((1, 256, 4, 128), (1, 256, 2, 128), AttentionOptions(0.088, local_window_size=(64, 0)))):
    kept = plans.attention_forward(dense(qs, "bfloat16"), dense(ks, "bfloat16"), dense(ks, "bfloat16"), opts, GPU,
                                   residuals=False)
    assert kept.launches[-1].kernel is kfwd.attention_fwd_kernel, (qs, opts)
  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "triton")
  triton_plan = plans.attention_forward(q, kv, kv, AttentionOptions(0.088), GPU, residuals=False)
  assert triton_plan.launches[-1].kernel is kfwd.attention_fwd_kernel
  monkeypatch.setenv(plans.FWD_KERNEL_ENV, "fast")
  with pytest.raises(ValueError, match="JQAT_ATTN_FWD_KERNEL must be one of"):
    plans.attention_forward(q, kv, kv, AttentionOptions(0.088), GPU, residuals=False)


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_ws_dkdv_plan_builds_for_sm90(monkeypatch, tmp_path):
  """By default (and with ``JQAT_ATTN_BWD_KERNEL=ws``) the backward's dK/dV launch on sm_90 is the warp-specialized
  Gluon kernel, on the same buffers as the Triton launch (fq(Q), fq(K), fq(V), dO, lse, delta) that
  ``JQAT_ATTN_BWD_KERNEL=triton`` gives, dK and dV written over fq(K) and fq(V) in place; it builds for sm_90 with
  its worker warps (12 in all), in block and row mode (reading the row factors), without spills at D = 64 and at
  D = 128 (64-row query tiles) with no spill traffic in its walk: stores only before it, and in row mode loads of
  loop invariants. A case it does not
  take, or a dK/dV launch configuration of one's own, keeps the Triton kernel; an unknown value is a ValueError naming
  the variable."""

  from jqat.kernels_triton import attention_bwd as kbwd

  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  dense = plans.Tensor.dense
  for d in (128, 64):
    x, kv, lse = dense((2, 128, 4, d), "bfloat16"), dense((2, 256, 2, d), "bfloat16"), dense((2, 4, 128), "float32")
    monkeypatch.setenv(plans.BWD_KERNEL_ENV, "triton")
    triton_plan = plans.attention_backward(x, x, kv, kv, x, lse, AttentionOptions(d**-0.5), GPU)
    monkeypatch.setenv(plans.BWD_KERNEL_ENV, "ws")
    plan = plans.attention_backward(x, x, kv, kv, x, lse, AttentionOptions(d**-0.5), GPU)
    monkeypatch.delenv(plans.BWD_KERNEL_ENV)  # the default is the warp-specialized kernel
    default = plans.attention_backward(x, x, kv, kv, x, lse, AttentionOptions(d**-0.5), GPU)
    assert default.launches[-1] == plan.launches[-1]
    launch, old = plan.launches[-1], triton_plan.launches[-1]
    assert launch.name == "jqat_attention_bwd_dkdv_ws" and old.kernel is kbwd.attention_bwd_dkdv_kernel
    assert [la.name for la in plan.launches[:-1]] == [la.name for la in triton_plan.launches[:-1]]
    assert launch.grid == (2, 4) and launch.outputs == ("dk", "dv", "dkdv_leaks") and old.outputs == ("dk", "dv")
    assert plan.stored_in == triton_plan.stored_in and set(plan.scratch) == {*triton_plan.scratch, "dkdv_leaks"}
    assert plan.buffers["dkdv_leaks"].shape == (1,)  # a placeholder: only a causal walk writes its flags
    refs = lambda la: [a.name for a in la.args if isinstance(a, plans.Ref)]
    assert refs(launch) == [n for n in refs(old) if n != "lse"][:3] + ["do", "lse", "delta", "lse"]  # rf: unread
    assert [(refs(launch)[i], o) for i, o in (launch.aliases)] == [(refs(old)[i], o) for i, o in old.aliases]
    usage, loops = _warp_specialized_build(plan, launch, tmp_path, loops=True)
    assert launch.constexprs["BLOCK_M"] == 64
    assert launch.constexprs["ROWS_IN_RING"] == (d == 64)  # lse and delta a tile ahead at D = 128, in the ring at 64
    assert d == 128 or re.search(r"STACK:0\b", usage), (d, usage)
    assert _walk_local_ops(loops, d // 8 + 64 // 8) == {"LDL": 0, "STL": 0}, d
  # p_scale="row": the same launch reading the row factors (the Triton launch's rf argument) with P_ROW_RANGE.
  x, kv, lse = dense((1, 96, 4, 128), "bfloat16"), dense((1, 256, 2, 128), "bfloat16"), dense((1, 4, 96), "float32")
  monkeypatch.setenv(plans.BWD_KERNEL_ENV, "triton")
  row_opts = AttentionOptions(0.088, p_scale="row")
  old = plans.attention_backward(x, x, kv, kv, x, lse, row_opts, GPU, row_max=lse).launches[-1]
  monkeypatch.delenv(plans.BWD_KERNEL_ENV)
  row = plans.attention_backward(x, x, kv, kv, x, lse, row_opts, GPU, row_max=lse)
  launch = row.launches[-1]
  assert launch.name == "jqat_attention_bwd_dkdv_ws" and launch.constexprs["P_ROW_RANGE"] == plans.P_ROW_RANGE > 0
  assert launch.constexprs["ROWS_IN_RING"]
  assert refs(launch) == [n for n in refs(old) if n != "lse"][:3] + ["do", "lse", "delta", "row_factors"]
  assert refs(old)[6] == "row_factors"
  assert _walk_local_ops(_warp_specialized_build(row, launch, tmp_path, loops=True)[1], 24)["STL"] == 0
  # Lengths its tiles do not divide (80 query rows, 208 keys: a multiple of 16): two key programs, masked row loads.
  x80, kv208 = dense((1, 80, 4, 128), "bfloat16"), dense((1, 208, 2, 128), "bfloat16")
  lse80 = dense((1, 4, 80), "float32")
  ragged = plans.attention_backward(x80, x80, kv208, kv208, x80, lse80, AttentionOptions(0.088), GPU)
  launch = ragged.launches[-1]
  assert launch.name == "jqat_attention_bwd_dkdv_ws" and launch.grid == (2, 2) and not launch.constexprs["EVEN"]
  assert _walk_local_ops(_warp_specialized_build(ragged, launch, tmp_path, loops=True)[1], 24) == {"LDL": 0, "STL": 0}
  row_ragged = plans.attention_backward(x80, x80, kv208, kv208, x80, lse80, AttentionOptions(0.088, p_scale="row"),
                                        GPU, row_max=lse80)
  launch = row_ragged.launches[-1]
  assert launch.name == "jqat_attention_bwd_dkdv_ws" and launch.grid == (2, 2) and not launch.constexprs["EVEN"]
  assert launch.constexprs["P_ROW_RANGE"] == plans.P_ROW_RANGE
  assert _walk_local_ops(_warp_specialized_build(row_ragged, launch, tmp_path, loops=True)[1], 24)["STL"] == 0
  # A causal mask (96 query rows, 256 keys): the kernel's causal walk (off: 0 top-left, Tk - Tq bottom-right), then
  # the Triton kernel's REDO launch over dK and dV (fq(K), fq(V) where a flag is set), reading the flags of its grid.
  for align, off in (("top_left", 0), ("bottom_right", 256 - 96)):
    causal = plans.attention_backward(x, x, kv, kv, x, lse,
                                      AttentionOptions(0.088, is_causal=True, causal_alignment=align), GPU)
    launch, redo = causal.launches[-2:]
    assert launch.name == "jqat_attention_bwd_dkdv_ws" and launch.constexprs["IS_CAUSAL"] and launch.args[12] == off
    assert launch.constexprs["ROWS_IN_RING"]
    assert launch.outputs == ("dk", "dv", "dkdv_leaks") and causal.buffers["dkdv_leaks"].shape == (2, 4)
    assert redo.kernel is kbwd.attention_bwd_dkdv_kernel and redo.constexprs["REDO"] and redo.grid == (4, 2)
    assert refs(redo)[1:3] == ["dk", "dv"] and refs(redo)[-1] == "dkdv_leaks" and redo.outputs == ("dk", "dv")
    assert [(refs(redo)[i], o) for i, o in redo.aliases] == [("dk", 0), ("dv", 1)]
  assert _walk_local_ops(_warp_specialized_build(causal, launch, tmp_path, loops=True)[1], 24)["STL"] == 0
  # At D = 64 the Triton kernel's key tiles are of 128: the REDO launch alone walks tiles of 64, the flags' tiles.
  x64, kv64 = dense((1, 96, 4, 64), "bfloat16"), dense((1, 256, 2, 64), "bfloat16")
  causal64 = plans.attention_backward(x64, x64, kv64, kv64, x64, lse, AttentionOptions(0.125, is_causal=True), GPU)
  launch, redo = causal64.launches[-2:]
  assert launch.name == "jqat_attention_bwd_dkdv_ws" and causal64.buffers["dkdv_leaks"].shape == (2, 4)
  assert redo.constexprs["REDO"] and redo.constexprs["BLOCK_N"] == 64 and redo.grid == (4, 2)
  assert plans.backward_config(64).kv_block_n == 128
  assert _walk_local_ops(_warp_specialized_build(causal64, launch, tmp_path, loops=True)[1], 16)["STL"] == 0
  # At D = 96 the kernel's tiles are of 128 channels (its copies' boxes over [T, heads, 96] read zeros past 96), as
  # the Triton kernel's: without a mask and causal.
  x96, kv96 = dense((1, 96, 4, 96), "bfloat16"), dense((1, 256, 2, 96), "bfloat16")
  for opts in (AttentionOptions(0.1), AttentionOptions(0.1, is_causal=True)):
    plan96 = plans.attention_backward(x96, x96, kv96, kv96, x96, lse, opts, GPU)
    launch = plan96.launches[-2 if opts.is_causal else -1]
    assert launch.name == "jqat_attention_bwd_dkdv_ws" and launch.constexprs["IS_CAUSAL"] == opts.is_causal
    assert launch.constexprs["HEAD_DIM"] == 96 and launch.constexprs["D_PAD"] == 128
    assert launch.constexprs["ROWS_IN_RING"] == opts.is_causal
    assert _walk_local_ops(_warp_specialized_build(plan96, launch, tmp_path, loops=True)[1], 24)["STL"] == 0
  # Cases it does not take keep the Triton kernel: causal without quantize_qkv (fq(K) not in dK's storage), 200 keys
  # (not a multiple of 16), a window, BHSD storage (heads not side by side).
  bhsd = lambda shape: plans.Tensor(shape, "bfloat16",
                                    (shape[1] * shape[2] * shape[3], shape[3], shape[1] * shape[3], 1))
  kv200 = dense((1, 200, 2, 128), "bfloat16")
  xt, kvt = bhsd((1, 96, 4, 128)), bhsd((1, 256, 2, 128))
  for args, opts in (((x, x, kv, kv, x, lse), AttentionOptions(0.088, is_causal=True,
                                                                  config=QATConfig(quantize_qkv=False))),
                     ((x, x, kv200, kv200, x, lse), AttentionOptions(0.088)),
                     ((x, x, kv, kv, x, lse), AttentionOptions(0.088, local_window_size=(64, 0))),
                     ((xt, xt, kvt, kvt, xt, lse), AttentionOptions(0.088))):
    kept = plans.attention_backward(*args, opts, GPU)
    assert kept.launches[-1].kernel is kbwd.attention_bwd_dkdv_kernel, opts
  own = dataclasses.replace(plans.backward_config(128), kv_num_stages=2)
  mine = plans.attention_backward(x, x, kv, kv, x, lse, AttentionOptions(0.088), GPU, config=own)
  assert mine.launches[-1].kernel is kbwd.attention_bwd_dkdv_kernel
  assert plans.attention_backward(x, x, kv, kv, x, lse, AttentionOptions(0.088), GPU,
                                  config=plans.backward_config(128)).launches[-1].kernel is not mine.launches[-1].kernel
  monkeypatch.setenv(plans.BWD_KERNEL_ENV, "fast")
  with pytest.raises(ValueError, match="JQAT_ATTN_BWD_KERNEL must be one of"):
    plans.attention_backward(x, x, kv, kv, x, lse, AttentionOptions(0.088), GPU)
