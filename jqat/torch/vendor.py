"""The vendor API names and contracts of ``seeds/`` on torch tensors: NVFP4 attention QAT forward and
backward (function and prepared class) and tail RoPE + QDQ in place (function and prepared class).

BHSD contiguous tensors; CUDA tensors run the same launch plans as :func:`jqat.torch.attention`
on the current stream, or on ``current_stream`` when given (a ``torch.cuda.Stream``, a raw
``cudaStream_t`` int, or an object with ``cuda_stream`` / ``int()``); CPU tensors run the XLA
reference through DLPack (not zero-copy). The caller orders the producers of the inputs before
that stream and keeps the inputs alive until the work finishes.
"""

from __future__ import annotations

import torch

import jqat
from jqat._src import rope_qdq as _rope_api
from jqat._src import validate
from jqat.ffi.options import AttentionOptions
from jqat.torch import _attention
from jqat.torch import _tensors as tt


class TupleDict(dict):
  """A dict that also unpacks like a tuple of its values, in insertion order.

  ``result["dq_tensor"]`` works as for a dict; ``dq, dk, dv = result``, ``list(result)``
  and ``result[0]`` give the values (iteration yields values, not keys; use
  ``result.keys()`` / ``result.items()`` for the keys).
  """

  def __iter__(self):
    return iter(self.values())

  def __getitem__(self, key):
    if isinstance(key, int):
      return list(self.values())[key]
    return super().__getitem__(key)



def _options(softmax_scale, is_causal, head_dim: int) -> AttentionOptions:
  """The vendor contract's options: Attn-QAT with every switch on, the default KV tile."""
  return validate.attention_options(head_dim=head_dim, scale=softmax_scale, is_causal=is_causal)


def nvfp4_attention_qat_forward(q, k, v, is_causal=False, softmax_scale=None, current_stream=None):
  """The QAT forward with the auxiliaries the backward needs: ``(o, high_precision_o, lse)``.

  q: [B, H, Sq, D]; k, v: [B, Hkv, Skv, D] (H % Hkv == 0); o, high_precision_o: [B, H, Sq, D]
  contiguous in q's dtype; lse: [B, H, Sq] fp32 (natural log, -inf for a row without keys).
  ``high_precision_o`` is O' = softmax(Q_fake K_fake^T) @ V_fake before probability fake
  quantization, the ``high_precision_o`` of :func:`nvfp4_attention_qat_backward`.
  """
  _attention.check_inputs(q, k, v)
  opts = _options(softmax_scale, is_causal, q.shape[-1])
  with tt.on_stream(current_stream, q.device):
    return _attention.forward(q, k, v, opts)


_BWD_NAMES = ("q_tensor", "k_tensor", "v_tensor", "high_precision_o_tensor", "do_tensor", "lse_tensor")


def _check_backward_inputs(q, k, v, high_precision_o, do, lse, *, contiguous=True):
  _attention.check_inputs(q, k, v, names=_BWD_NAMES[:3])
  for name, t in (("high_precision_o_tensor", high_precision_o), ("do_tensor", do), ("lse_tensor", lse)):
    tt.check_tensor(name, t)
    tt.check_device(name, t, q.device)
  _attention.refuse_forward_ad("nvfp4_attention_qat_backward", _BWD_NAMES[3:], (high_precision_o, do, lse))
  for name, t in (("high_precision_o_tensor", high_precision_o), ("do_tensor", do)):
    if tuple(t.shape) != tuple(q.shape):
      raise ValueError(f"{name} must have the shape of q_tensor {tuple(q.shape)}, got {tuple(t.shape)}")
    if t.dtype != q.dtype:
      raise TypeError(f"{name} must have the dtype of q_tensor ({q.dtype}), got {t.dtype}")
  want = tuple(q.shape[:3])
  if tuple(lse.shape) != want or lse.dtype != torch.float32:
    raise ValueError(f"lse_tensor must be float32 of shape {want} [B, H, S_q], got {lse.dtype} {tuple(lse.shape)}")
  if contiguous:
    for name, t in zip(_BWD_NAMES, (q, k, v, high_precision_o, do, lse)):
      if not t.is_contiguous():  # a layout the vendor API does not take (torch's convention: NotImplementedError)
        raise NotImplementedError(f"{name} must be contiguous BHSD storage, got strides {tuple(t.stride())}")


def _check_grad_buffers(inputs, grads):
  """dq/dk/dv: contiguous, the shape, dtype and device of q/k/v, overlapping no input and no other output."""
  for name, g, like in zip(("dq_tensor", "dk_tensor", "dv_tensor"), grads, inputs[:3]):
    tt.check_output(name, g, like, list(zip(_BWD_NAMES, inputs)), contiguous=True)
  names = ("dq_tensor", "dk_tensor", "dv_tensor")
  for i in range(3):
    for j in range(i + 1, 3):
      if tt.overlap(grads[i], grads[j]):
        raise ValueError(f"{names[j]} overlaps {names[i]}")


class Nvfp4AttentionQatBackward:
  """Prepared NVFP4 attention QAT backward (vendor class API).

  ``op = Nvfp4AttentionQatBackward(q, k, v, high_precision_o, do, lse, is_causal=False, softmax_scale=None)``
  plans for those shapes, dtypes and device; ``check_support()`` validates (raises naming
  the argument; returns True); ``compile()`` compiles every kernel the plan launches without
  launching it (modules loaded); ``scratch_workspace_bytes()`` is the size of the 1-D
  ``torch.uint8`` workspace ``execute`` needs (delta [B, H, Sq] fp32 plus fq(Q), each at a 256-byte
  aligned offset; fq(K) and fq(V) live in dk's and dv's storage); ``execute(...)`` (after ``compile()``,
  else RuntimeError) writes dq, dk, dv into the caller's contiguous, 16-byte aligned buffers and returns
  ``TupleDict(dq_tensor=, dk_tensor=, dv_tensor=)``; on CUDA it launches the compiled kernels and nothing
  else (no allocation, compilation or tensor operation: capturable in a CUDA graph). On CPU tensors
  ``execute`` runs the JAX reference (which allocates its own buffers) and copies the results into dq, dk, dv.

  Supports more than the vendor page: H % Hkv == 0 (GQA/MQA), any D % 16 == 0, fp16/fp32,
  causal with Sq != Skv (top-left aligned), Hopper and Ampere.
  """

  def __init__(self, q, k, v, high_precision_o, do, lse, is_causal=False, softmax_scale=None):
    self._planned = (q, k, v, high_precision_o, do, lse)
    self.is_causal = is_causal
    self.softmax_scale = softmax_scale
    self._plan = None
    self._compiled = False
    self._prepared = None  # CUDA: the plan's kernels compiled by compile() (torch_launch.Prepared)

  def check_support(self):
    q, k, v, o_hp, do, lse = self._planned
    _check_backward_inputs(q, k, v, o_hp, do, lse)
    self.device, self.dtype = q.device, q.dtype
    self.q_shape, self.kv_shape = tuple(q.shape), tuple(k.shape)
    self.opts = _options(self.softmax_scale, self.is_causal, q.shape[-1])
    self._plan, _ = _attention.backward_plan(do, q, k, v, o_hp, lse, self.opts)
    return True

  def _require_checked(self):
    if self._plan is None:
      self.check_support()

  def scratch_workspace_bytes(self) -> int:
    """Bytes of the plan's scratch (delta [B, H, Sq] fp32 and, where the plan needs them, fq(Q), row
    factors and kernel flags, 256-byte aligned each; fq(K) and fq(V) live in dk's and dv's storage)."""
    self._require_checked()
    from jqat.ffi import torch_launch  # noqa: PLC0415

    return torch_launch.workspace_bytes(self._plan)

  def compile(self):
    """Compiles every kernel of the plan (CUDA: for 16-byte aligned buffers, modules loaded, nothing launched), after
    which ``execute`` launches them and nothing else; on CPU it only marks the op ready."""
    self._require_checked()
    q = self._planned[0]
    if self.device.type == "cuda":
      from jqat.ffi import torch_launch  # noqa: PLC0415

      if not torch_launch.interpreting(q):
        with torch.cuda.device(self.device):
          self._prepared = torch_launch.Prepared(self._plan, torch_launch.target(q))
        self._offsets = torch_launch.workspace_offsets(self._plan)
    self._compiled = True
    return self

  def execute(self, q, k, v, high_precision_o, do, lse, dq, dk, dv, workspace, current_stream=None):
    """Writes dQ, dK, dV into ``dq``, ``dk``, ``dv`` (contiguous, shaped like q, k, v) and returns
    ``TupleDict(dq_tensor=dq, dk_tensor=dk, dv_tensor=dv)``. CUDA: the kernels ``compile()`` built, on the current
    (or given) stream, and nothing else: no allocation, no compilation, no tensor operation (every tensor 16-byte
    aligned, as the vendor contract says). Raises RuntimeError before ``compile()``, touching nothing."""
    if not self._compiled:
      raise RuntimeError("Nvfp4AttentionQatBackward.execute needs compile() first: call op.compile() once (it "
                         "builds the kernels that execute launches)")
    _check_backward_inputs(q, k, v, high_precision_o, do, lse)
    if q.device != self.device or q.dtype != self.dtype or tuple(q.shape) != self.q_shape \
        or tuple(k.shape) != self.kv_shape:
      raise ValueError(f"q_tensor/k_tensor must match the plan ({self.dtype} {self.q_shape}, {self.kv_shape} on "
                       f"{self.device}), got {q.dtype} {tuple(q.shape)}, {tuple(k.shape)} on {q.device}")
    inputs = (q, k, v, high_precision_o, do, lse)
    _check_grad_buffers(inputs, (dq, dk, dv))
    need = self.scratch_workspace_bytes()
    tt.check_tensor("workspace", workspace)
    if workspace.dtype != torch.uint8 or workspace.dim() != 1 or workspace.numel() < need:
      raise ValueError(f"workspace must be a 1-D torch.uint8 tensor of at least {need} bytes, got {workspace.dtype} "
                       f"{tuple(workspace.shape)}")
    tt.check_device("workspace", workspace, self.device)
    if not workspace.is_contiguous() or workspace.data_ptr() % 16:
      raise ValueError("workspace must be contiguous and 16-byte aligned, got data_ptr "
                       f"{workspace.data_ptr():#x}, stride {workspace.stride()}")
    for name, t in zip(_BWD_NAMES + ("dq_tensor", "dk_tensor", "dv_tensor"), inputs + (dq, dk, dv)):
      if tt.overlap(workspace, t):
        raise ValueError(f"workspace overlaps {name}")
    if self._prepared is not None:
      for name, t in zip(_BWD_NAMES + ("dq_tensor", "dk_tensor", "dv_tensor"), inputs + (dq, dk, dv)):
        if t.numel() and t.data_ptr() % 16:
          raise ValueError(f"{name} must be 16-byte aligned (the vendor contract; the prepared kernels read it in "
                           f"16-byte accesses), got data_ptr {t.data_ptr():#x}")
      with tt.on_stream(current_stream, self.device):
        self._launch_prepared(dict(do=do, q=q, k=k, v=v, o_for_delta=high_precision_o, lse=lse, dq=dq, dk=dk, dv=dv),
                              workspace)
    else:
      with tt.on_stream(current_stream, self.device):
        _attention.backward(do, q, k, v, high_precision_o, lse, self.opts, out=(dq, dk, dv),
                            workspace=workspace if self.device.type == "cuda" else None)
    return TupleDict(dq_tensor=dq, dk_tensor=dk, dv_tensor=dv)

  def _launch_prepared(self, buffers: dict, workspace):
    """The plan's launches with the caller's tensors and the workspace's addresses: no views, no allocation."""
    from jqat.ffi import plan as plans  # noqa: PLC0415
    from jqat.ffi import torch_launch  # noqa: PLC0415

    plan = self._plan
    base = workspace.data_ptr()
    buffers.update({name: torch_launch.Address(base + off) for name, off in self._offsets.items()})
    buffers.update({name: buffers[out] for name, out in plan.stored_in.items()})
    for name, value in plan.fills.items():  # an empty problem: constants, no kernel
      buffers[name].fill_(value)
    for i, launch in enumerate(plan.launches):
      args = tuple(buffers[a.name] if isinstance(a, plans.Ref) else a for a in launch.args)
      self._prepared.launch(i, launch.grid, args + tuple(buffers[o] for o in launch.outputs))


def nvfp4_attention_qat_backward(do, q, k, v, high_precision_o, lse, is_causal=False, softmax_scale=None,
                                 dq_tensor=None, dk_tensor=None, dv_tensor=None, current_stream=None):
  """dQ, dK, dV of NVFP4 QAT attention (vendor wrapper): ``TupleDict(dq_tensor=, dk_tensor=, dv_tensor=)``.

  BHSD contiguous tensors: q, do, high_precision_o [B, H, Sq, D]; k, v [B, Hkv, Skv, D];
  lse [B, H, Sq] fp32 from :func:`nvfp4_attention_qat_forward`. ``dq, dk, dv = result`` and
  ``result["dq_tensor"]`` both work. Preallocated dq/dk/dv tensors are written in place;
  missing ones (and the workspace) are allocated on the stream the work runs on.
  """
  _check_backward_inputs(q, k, v, high_precision_o, do, lse)
  op = Nvfp4AttentionQatBackward(q, k, v, high_precision_o, do, lse, is_causal=is_causal,
                                 softmax_scale=softmax_scale)
  op.check_support()
  with tt.on_stream(current_stream, q.device):
    grads = [g if g is not None else torch.empty_like(like, memory_format=torch.contiguous_format)
             for g, like in zip((dq_tensor, dk_tensor, dv_tensor), (q, k, v))]
    _check_grad_buffers((q, k, v, high_precision_o, do, lse), grads)
    _attention.backward(do, q, k, v, high_precision_o, lse, op.opts, out=grads)
  return TupleDict(dq_tensor=grads[0], dk_tensor=grads[1], dv_tensor=grads[2])



_PLANS_KEPT = 16  # launch plans a RopeQDQInplace keeps (one per shape seen, the latest)


def _check_rope(x, cache, positions, mode):
  """Static checks of rope_qdq_inplace (docs/API.md, section 3); nothing is touched on failure."""
  _attention.refuse_forward_ad("rope_qdq_inplace", ("x", "cache", "positions"), (x, cache, positions))
  for name, t in (("x", x), ("cache", cache), ("positions", positions)):
    tt.check_tensor(name, t)
    if t.requires_grad:
      raise ValueError(f"{name} must not require grad: rope_qdq_inplace mutates x and has no backward")
  _rope_api.check_arrays(x, cache, positions, mode)
  tt.check_device("cache", cache, x.device)
  tt.check_device("positions", positions, x.device)
  tt.check_backend(x.device)
  if x.is_inference() and not torch.is_inference_mode_enabled():
    raise ValueError("x is an inference tensor (made under torch.inference_mode()): rope_qdq_inplace writes it in "
                     "place, which torch allows only inside inference mode; call it there or pass x.clone()")
  for name, t in (("x", x), ("cache", cache), ("positions", positions)):
    if not t.is_contiguous():  # a layout the op does not take (torch's convention: NotImplementedError)
      raise NotImplementedError(f"{name} must be contiguous, got shape {tuple(t.shape)} with strides "
                                f"{tuple(t.stride())}")
  for name, t in (("cache", cache), ("positions", positions)):
    if tt.overlap(x, t):
      raise ValueError(f"x overlaps {name}: x is written in place and must not share storage with its inputs")
  n_rows = x.numel() // mode.width
  if n_rows >= 2**31:
    raise ValueError(f"x has {n_rows} rows of {mode.width}; at most 2**31 - 1 are supported")


class RopeQDQInplace:
  """Prepared tail RoPE + microscaled QDQ written over ``x`` (vendor class API).

  ``op = RopeQDQInplace(x, cache, positions, quantization="fp4", group_size=32, scale_format="ue8m0",
  backend="frost")``; ``check_support()`` validates (returns True); ``compile()`` builds the kernel (CUDA: for aligned
  and for any pointer offsets, modules loaded, nothing launched; on CPU it only marks the op ready);
  ``scratch_workspace_bytes()`` is 0; ``execute(x, cache, positions, current_stream=None)`` mutates x's storage and
  returns ``TupleDict(out=x)``; before ``compile()`` it raises RuntimeError and touches nothing. The plan accepts
  new token counts, leading dims, cache lengths, positions and pointer alignments; the mode, the group-32 FP4 head
  count, the positions dtype and the device stay fixed.

  CUDA: one kernel launch and nothing else, no allocation, no synchronization, no compilation and no tensor
  operation (capturable in a CUDA graph as that kernel alone); x's version counter is bumped, as by any in-place
  torch op, so autograd refuses a backward that saved x before. CPU: the JAX reference computes a new buffer
  (through DLPack) that is then copied into x with ``x.copy_`` -- not zero-copy.
  """

  def __init__(self, x, cache, positions, quantization="fp4", group_size=32, scale_format="ue8m0",
               backend="frost"):
    if backend != "frost":
      raise ValueError(f"backend must be 'frost' (the only backend), got {backend!r}")
    self.mode = _rope_api._mode(quantization, group_size, scale_format)
    self.quantization, self.group_size, self.scale_format = quantization, int(group_size), scale_format
    self._planned = (x, cache, positions)
    self._checked = False
    self._compiled = False
    self._prepared = None  # CUDA, after compile(): (torch_launch.Prepared, BLOCK_R)
    self._plans = {}  # (x, cache, positions shapes) -> launch plan, at most _PLANS_KEPT, oldest first

  def check_support(self):
    x, cache, positions = self._planned
    _check_rope(x, cache, positions, self.mode)
    self.device, self.pos_dtype = x.device, positions.dtype
    self.heads = x.shape[1] if self.mode.per_token else 1
    self._checked = True
    return True

  def scratch_workspace_bytes(self) -> int:
    return 0

  def _plan_for(self, x, cache, positions):
    from jqat.ffi import plan as plans  # noqa: PLC0415  (imports triton; only needed on CUDA)
    from jqat.ffi import torch_launch  # noqa: PLC0415

    m = self.mode
    return plans.rope_qdq(*(torch_launch.describe(t) for t in (x, cache, positions)), torch_launch.target(x),
                          heads=x.shape[1] if m.per_token else 1, group=m.group, fp8=m.fp8, e4m3_scale=m.e4m3_scale,
                          amax_floor=m.floor)

  def _launch(self, x, cache, positions):
    """The plan of one call (the wrapper's path, and the interpreter's), executed over x itself by Triton's launcher."""
    from jqat.ffi import torch_launch  # noqa: PLC0415

    positions = positions.reshape(-1)
    # The checks fixed the dtypes, the device and contiguity, so the shapes (and whether Triton interprets) select the
    # plan. Building one cost about as much host time as launching it (measured on the H200), so the op keeps
    # the latest few.
    key = (x.shape, cache.shape, positions.shape, torch_launch.interpreting(x))
    plan = self._plans.get(key)
    if plan is None:
      plan = self._plan_for(x, cache, positions)
      if len(self._plans) >= _PLANS_KEPT:
        del self._plans[next(iter(self._plans))]  # the oldest
      self._plans[key] = plan
    torch_launch.execute(plan, {"x": x, "cache": cache, "positions": positions, "out": x})
    _bump_version(x)

  def _launch_prepared(self, x, cache, positions):
    """compile()'s kernel over x: host arithmetic and one launch, no plan, no view, no compile."""
    prepared, block_r = self._prepared
    n_rows = x.numel() // self.mode.width
    aligned = x.data_ptr() % 16 == 0 and cache.data_ptr() % 16 == 0 and positions.data_ptr() % 16 == 0
    prepared.launch(0, (-(-n_rows // block_r),), (x, cache, positions, n_rows, cache.shape[0], self.heads, x),
                    "aligned" if aligned else "any")
    _bump_version(x)

  def compile(self):
    if not self._checked:
      self.check_support()
    if self.device.type == "cuda":
      from jqat.ffi import plan as plans  # noqa: PLC0415
      from jqat.ffi import torch_launch  # noqa: PLC0415

      x = self._planned[0]
      if not torch_launch.interpreting(x):
        # One row of the planned shapes: the kernel's integers are not specialized, so it serves every token count.
        rows = (1, self.heads, self.mode.width) if self.mode.per_token else (1, self.mode.width)
        probe = (plans.Tensor.dense(rows, "bfloat16"), plans.Tensor.dense((1, 64), "float32"),
                 plans.Tensor.dense((1,), str(self.pos_dtype).removeprefix("torch.")))
        m = self.mode
        plan = plans.rope_qdq(*probe, torch_launch.target(x), heads=self.heads, group=m.group, fp8=m.fp8,
                              e4m3_scale=m.e4m3_scale, amax_floor=m.floor)
        with torch.cuda.device(self.device):
          prepared = torch_launch.Prepared(plan, torch_launch.target(x), variants=("aligned", "any"))
        self._prepared = (prepared, plan.launches[0].constexprs["BLOCK_R"])
    self._compiled = True
    return self

  def _check_execute(self, x, cache, positions):
    if not self._checked:
      self.check_support()
    _check_rope(x, cache, positions, self.mode)
    if x.device != self.device:
      raise ValueError(f"x must be on the planned device {self.device}, got {x.device}")
    if positions.dtype != self.pos_dtype:
      raise ValueError(f"positions must have the planned dtype {self.pos_dtype} (the prepared kernel reads it so), "
                       f"got {positions.dtype}")
    if self.mode.per_token and x.shape[1] != self.heads:
      raise ValueError(f"x must have the planned head count {self.heads} (x.shape[1]), got {x.shape[1]}")
    if cache.shape[0] >= 2**31:
      raise ValueError(f"cache must have fewer than 2**31 rows, got {cache.shape[0]}")

  def execute(self, x, cache, positions, current_stream=None):
    if not self._compiled:
      raise RuntimeError("RopeQDQInplace.execute needs compile() first: call op.compile() once (it builds the "
                         "kernel that execute launches)")
    self._check_execute(x, cache, positions)
    self._run(x, cache, positions, current_stream, prepared=True)
    return TupleDict(out=x)

  def _run(self, x, cache, positions, current_stream, prepared=False):
    if x.numel() == 0:
      return
    if x.device.type == "cpu":
      # JAX without x64 narrows int64 by wrapping: clamp into [0, P) first, as the kernel does.
      positions = positions.clamp(0, cache.shape[0] - 1).to(torch.int32)
      out = jqat.rope_qdq(tt.to_jax(x), tt.to_jax(cache), tt.to_jax(positions), quantization=self.quantization,
                          group_size=self.group_size, scale_format=self.scale_format, implementation="xla")
      x.copy_(tt.from_jax(out))
      return
    with tt.on_stream(current_stream, x.device):
      if prepared and self._prepared is not None:
        self._launch_prepared(x, cache, positions)
      else:
        self._launch(x, cache, positions)


def _bump_version(x):
  """x was written by a kernel, behind autograd's back: count it as the in-place write it is (as ``x.copy_`` does on
  the CPU path), so that a backward that saved x raises instead of reading the rotated values."""
  torch.autograd.graph.increment_version(x)


def rope_qdq_inplace(x, cache, positions, quantization="fp4", group_size=32, scale_format="ue8m0",
                     current_stream=None):
  """Tail RoPE on the last 64 channels + microscaled QDQ of every channel, written over ``x``.

  x: contiguous bf16 [N, H, 128] (fp4/32/ue8m0) or [..., 512] (fp8/32/ue8m0, fp4/16/e4m3);
  cache: contiguous fp32 [P, 64] (32 cosines then 32 sines); positions: contiguous int32/int64,
  one id per token ([N]) for group-32 FP4, else one per 512-channel row (x.shape[:-1] or flat).
  Returns ``TupleDict(out=x)``: ``result["out"] is x``. Every check runs before anything is
  launched, and x is untouched when one fails. CUDA: in place, on the current (or given)
  stream. CPU: JAX reference through DLPack, then ``x.copy_`` (not zero-copy).
  """
  op = RopeQDQInplace(x, cache, positions, quantization=quantization, group_size=group_size,
                      scale_format=scale_format)
  op.check_support()
  op._run(x, cache, positions, current_stream)
  return TupleDict(out=x)
