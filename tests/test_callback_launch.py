"""The callback launcher (``JQAT_JAX_LAUNCHER=callback``, ``jqat/ffi/callback_launch.py``) of the JAX binding.

CPU (``TRITON_INTERPRET=1``): ``buffer_callback`` hands the callback host buffers and the
plan's kernels run in Triton's interpreter on them, so the public API with
``implementation="triton"`` (the GPU check of the dispatcher bypassed) runs end to end
under jit: its forward and gradients against the XLA reference, with the bounds of
tests/test_attention_triton.py (whose reasons apply: the interpreter is not the reference).

CPU, compiled for sm_90 without a GPU: each launch of the attention plans builds the same
PTX as jax-triton 0.3.1's own factory, and the build path never imports torch.

GPU (``@pytest.mark.gpu``): the callback launcher against jax-triton on the same plans, within
the kernel bounds above, not bit for bit. The PTX is the same (the CPU test), but it is
assembled by two ptxas: Triton's bundled one (CUDA 12.8 with triton 3.6) here, jaxlib's (CUDA 13)
there, and the PTX holds plain ``mul.f32`` / ``add.f32`` that ptxas may contract into FMAs, which
moves FP32 roundings and can flip an fq decision, as between kernel and reference. The test
prints how many elements differ at all (0 when both assemblers agree).
"""

import os

from conftest import HAS_GPU  # noqa: E402

os.environ.setdefault("TRITON_INTERPRET", "0" if HAS_GPU else "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import assert_close  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("triton")

# BOUNDS and _inputs: tests/test_attention_triton.py's (importing it also applies its NumPy >= 2.4 interpreter fix).
from test_attention_triton import BOUNDS, _inputs  # noqa: E402

import jqat  # noqa: E402
from jqat._src import dispatch  # noqa: E402
from jqat.ffi import callback_launch, jax_launch, scratch_pool  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"


@pytest.fixture
def launcher(monkeypatch):
  """Sets ``JQAT_JAX_LAUNCHER`` for one test (read whenever an op is traced)."""
  return lambda name: monkeypatch.setenv(callback_launch.ENV, name)


def _loss_and_grads(q, k, v, w, implementation):
  """O and d(sum(w * O))/d(q, k, v) of jqat.attention under jit (causal, GQA)."""

  def loss(q, k, v):
    o = jqat.attention(q, k, v, is_causal=True, implementation=implementation)
    return jnp.sum(w * o.astype(jnp.float32)), o

  (_, o), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return o, grads


def _case(b, tq, tk, n, kh, d, seed=0):
  q, k, v, w = _inputs(b, tq, tk, n, kh, d, "bfloat16", seed)
  return tuple(jnp.asarray(x).astype(jnp.bfloat16) for x in (q, k, v)) + (jnp.asarray(w),)


def test_launcher_env_is_validated(launcher):
  launcher("cuda-graph")
  with pytest.raises(ValueError, match="JQAT_JAX_LAUNCHER must be one of"):
    callback_launch.launcher()


def _assert_triton_matches_xla(q, k, v, w):
  """Forward and gradients of the loss through the Triton path (the launcher in use) vs the XLA reference."""
  o, grads = _loss_and_grads(q, k, v, w, "triton")
  r_o, r_grads = _loss_and_grads(q, k, v, w, "xla")
  f = lambda x: np.asarray(x.astype(jnp.float32))
  assert_close(f(o), f(r_o), rel=BOUNDS["O"], name="O")
  for name, got, want in zip(("dQ", "dK", "dV"), grads, r_grads):
    assert_close(f(got), f(want), rel=BOUNDS[name], name=name)


@pytest.mark.skipif(not INTERPRET, reason="the interpreter path of the callback launcher (CPU)")
def test_callback_interpreted_matches_reference(launcher, monkeypatch):
  """Forward and gradients through buffer_callback + Triton's interpreter vs the XLA reference (odd sizes)."""
  launcher("callback")
  monkeypatch.setattr(dispatch, "triton_unavailable_reason", lambda: None)
  q, k, v, w = _case(1, 17, 40, 2, 1, 64)
  _assert_triton_matches_xla(q, k, v, w)


@pytest.mark.skipif(not INTERPRET, reason="the interpreter path of the callback launcher (CPU)")
@pytest.mark.parametrize("causal", [False, True])
def test_vjp_residuals_are_the_forwards_quantized_inputs(launcher, monkeypatch, causal):
  """jax.vjp of jqat.attention keeps the forward's fq(K), fq(V) as residuals and its backward does not quantize
  them again: its gradients equal, bit for bit, the explicit attention_backward's on the inputs themselves, whose
  plan runs the quantize passes (the same Triton kernels in the interpreter on the same values; the quantizer is
  exact)."""
  launcher("callback")
  monkeypatch.setattr(dispatch, "triton_unavailable_reason", lambda: None)
  q, k, v, w = _case(1, 17, 40, 2, 1, 64, seed=int(causal))
  do = w.astype(jnp.bfloat16)
  o, vjp = jax.vjp(lambda q, k, v: jqat.attention(q, k, v, is_causal=causal, implementation="triton"), q, k, v)
  got = vjp(do)
  o2, o_hp, lse = jqat.attention_forward(q, k, v, is_causal=causal, implementation="triton")
  want = jqat.attention_backward(do, q, k, v, o_hp, lse, is_causal=causal, implementation="triton")
  bits = lambda x: np.asarray(x).view(np.uint16)
  np.testing.assert_array_equal(bits(o), bits(o2))
  for name, g, r in zip(("dQ", "dK", "dV"), got, want):
    np.testing.assert_array_equal(bits(g), bits(r), err_msg=name)


@pytest.mark.parametrize("mode,shape", [(("fp4", 32, "ue8m0"), (5, 3, 128)), (("fp4", 16, "e4m3"), (7, 512)),
                                        (("fp8", 32, "ue8m0"), (300, 512))], ids=str)
def test_callback_rope_qdq_in_place(launcher, monkeypatch, mode, shape):
  """rope_qdq through buffer_callback (its output aliases x, donated under jit) bit for bit against the oracle
  (the spec is exact): compiled on a GPU; on the CPU interpreted, with the GPU's FMA and BF16 load as in
  tests/test_rope_qdq.py."""
  from oracle_rope import rope_qdq_oracle
  from test_rope_qdq import _interpreter_kernel, assert_bitwise, random_case

  if INTERPRET:
    _interpreter_kernel()
    monkeypatch.setattr(dispatch, "triton_unavailable_reason", lambda: None)
  launcher("callback")
  x, cache, pos = random_case(mode, shape, 1.0)
  quantization, group_size, scale_format = mode
  run = jax.jit(lambda x, c, p: jqat.rope_qdq(x, c, p, quantization=quantization, group_size=group_size,
                                              scale_format=scale_format, implementation="triton"), donate_argnums=0)
  got = run(jnp.asarray(x), jnp.asarray(cache), jnp.asarray(pos))
  assert_bitwise(np.asarray(got), rope_qdq_oracle(x, cache, pos, *mode), "rope_qdq (callback)")


def _launch_avals(plan, launch):
  """A plan launch's arguments (arrays as ``ShapedArray``, scalars as they are) and outputs, as the JAX binding traces
  them."""
  from jqat.ffi import plan as plans

  aval = lambda name: jax.core.ShapedArray(plan.buffers[name].shape, jnp.dtype(plan.buffers[name].dtype))
  return (tuple(aval(a.name) if isinstance(a, plans.Ref) else a for a in launch.args),
          tuple(aval(o) for o in launch.outputs))


def _build(launch, args, outs, target):
  """The callback launcher's ``build`` of one launch for ``target`` (Triton's ``CompiledKernel``)."""
  return callback_launch.build(launch.kernel, callback_launch._arg_types(launch, args, outs),
                               callback_launch._ones(launch), tuple(launch.constexprs.items()), launch.num_warps,
                               launch.num_stages, target.compute_capability, launch.maxnreg)


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_builds_jax_tritons_ptx(monkeypatch, tmp_path, direction):
  """Every launch of the attention plans for sm_90 compiles to the PTX that jax-triton 0.3.1's own factory
  (run on the CPU through tests/test_ffi.py's harness) builds for it: the same kernels, so the GPU comparison
  below can be bitwise. jax-triton's argument types come from its own ``get_triton_type``."""
  from test_ffi import _real_triton_lib
  from triton.backends.compiler import GPUTarget
  from triton.backends.nvidia.compiler import CUDABackend

  from jqat.ffi import plan as plans
  from jqat.ffi.options import DEFAULT_BLOCK_N, AttentionOptions, QATConfig

  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  lib, _ = _real_triton_lib(monkeypatch)
  target = plans.Target((9, 0))
  q, k = plans.Tensor.dense((1, 40, 2, 64), "bfloat16"), plans.Tensor.dense((1, 72, 1, 64), "bfloat16")
  lse = plans.Tensor.dense((1, 2, 40), "float32")
  # No mask: the argument typing under test does not depend on it, and the masked kernels' exact walks double the
  # build time.
  opts = AttentionOptions(64**-0.5, False, DEFAULT_BLOCK_N, QATConfig())
  plan = (plans.attention_forward(q, k, k, opts, target) if direction == "forward"
          else plans.attention_backward(q, q, k, k, q, lse, opts, target))
  for launch in plan.launches:
    args, outs = _launch_avals(plan, launch)
    # What jqat.ffi.triton_call hands jax-triton: FP32 scalars as np.float32, the rest as they are.
    typed = tuple(np.float32(a) if isinstance(a, float) else a for a in args)
    scalars = tuple((i, lib.get_triton_type(a), float(a) if isinstance(a, np.float32) else a)
                    for i, a in enumerate(typed) if not isinstance(a, jax.core.ShapedArray))
    want, _ = lib.get_or_create_triton_kernel(
        lambda device, cc: CUDABackend(GPUTarget("cuda", cc, 32)), "cuda", launch.kernel,
        [lib.get_triton_type(a) for a in typed + outs], scalars, num_warps=launch.num_warps,
        num_stages=launch.num_stages, num_ctas=1, compute_capability=90, enable_fp_fusion=True,
        metaparams=dict(launch.constexprs), dump=False)
    got = _build(launch, args, outs, target)
    assert got.asm["ptx"] == want.ctor_args[4], f"{launch.name}: the PTX differs from jax-triton's"
    assert got.metadata.shared == want.ctor_args[3], f"{launch.name}: shared memory differs from jax-triton's"


_NO_TORCH_CHILD = r"""
import sys
import jax
from jqat.ffi import callback_launch, plan as plans
x, cache, pos = (plans.Tensor.dense(s, d) for s, d in (((4, 128), "bfloat16"), ((8, 64), "float32"), ((4,), "int32")))
(launch,) = plans.rope_qdq(x, cache, pos, plans.Target((9, 0)), heads=1, group=32, fp8=False, e4m3_scale=False,
                           amax_floor=0.0).launches
aval = {"x": x, "cache": cache, "positions": pos}
args = tuple(jax.ShapeDtypeStruct(aval[a.name].shape, aval[a.name].dtype) if isinstance(a, plans.Ref) else a
             for a in launch.args)
types = callback_launch._arg_types(launch, args, (jax.ShapeDtypeStruct(x.shape, x.dtype),))
callback_launch.build(launch.kernel, types, callback_launch._ones(launch), tuple(launch.constexprs.items()),
                      launch.num_warps, launch.num_stages, (9, 0))
print("RESULT", "torch" in sys.modules)
"""


def test_build_does_not_import_torch(tmp_path):
  """The callback launcher's compile path (run in every new process, served by Triton's disk cache when warm)
  must not import torch: that import would cost more of the warm start than ptxas does."""
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "TRITON_INTERPRET": "0", "JQAT_CACHE_DIR": str(tmp_path), "PYTHONPATH": root}
  env.pop("TRITON_CACHE_DIR", None)
  proc = subprocess.run([sys.executable, "-c", _NO_TORCH_CHILD], env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "RESULT False" in proc.stdout, f"torch was imported: {proc.stdout[-500:]}"


_SHARDED_CHILD = r"""
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jqat
from jqat._src import dispatch
from test_attention_triton import _inputs
dispatch.triton_unavailable_reason = lambda: None
q, k, v = (jnp.asarray(x).astype(jnp.bfloat16) for x in _inputs(2, 17, 40, 2, 1, 64, "bfloat16")[:3])
sharded = [jax.device_put(x, NamedSharding(Mesh(np.array(jax.devices()), ("b",)), P("b"))) for x in (q, k, v)]
o = jax.jit(lambda q, k, v: jqat.attention(q, k, v, is_causal=True, implementation="triton"))(*sharded)
jax.effects_barrier()
r = jqat.attention(q, k, v, is_causal=True, implementation="xla")
o, r = (np.asarray(x.astype(jnp.float32), np.float64) for x in (o, r))
print("RESULT", len(jax.devices()), np.linalg.norm(o - r) / np.linalg.norm(r))
"""


@pytest.mark.skipif(not INTERPRET, reason="the interpreter path of the callback launcher (CPU)")
def test_callback_interpreted_batch_sharded(tmp_path):
  """Batch-sharded inputs on two CPU devices: the callback launcher has no partitioning rule (custom_partitioning
  would drop its host callbacks: a segfault), so XLA gathers them, with a warning; every device's callback must
  run cleanly and O stay within the bound of tests/test_attention_triton.py."""
  import subprocess
  import sys

  tests = os.path.dirname(os.path.abspath(__file__))
  env = {**os.environ, "TRITON_INTERPRET": "1", "JQAT_JAX_LAUNCHER": "callback", "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
         "PYTHONPATH": os.pathsep.join([os.path.dirname(tests), tests])}
  proc = subprocess.run([sys.executable, "-c", _SHARDED_CHILD], env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  devices, err = proc.stdout.split("RESULT")[-1].split()
  assert int(devices) == 2 and float(err) <= BOUNDS["O"], proc.stdout[-1000:]
  assert "has no partitioning rule" in proc.stderr, "the gathering is not announced"


class _FakeCuda:
  """libcuda's stream-ordered allocator, recorded: ``cuMemAllocAsync`` hands out addresses, ``cuMemFreeAsync``
  takes them back; ``thresholds`` are the release thresholds of the devices' current pools (None: a device whose
  pool cannot be read), ``count_status`` what ``cuDeviceGetCount`` returns (3: CUDA_ERROR_NOT_INITIALIZED)."""

  def __init__(self, thresholds=(0,), count_status=0):
    self.calls = []
    self.thresholds = list(thresholds)
    self.count_status = count_status

  def cuDeviceGetCount(self, count):  # noqa: N802 (the CUDA name)
    count._obj.value = len(self.thresholds)
    return self.count_status

  def cuDeviceGet(self, device, ordinal):  # noqa: N802
    device._obj.value = 10 + ordinal
    return 0

  def cuDeviceGetMemPool(self, pool, device):  # noqa: N802
    pool._obj.value = 0x900 + device.value
    return 0

  def cuMemPoolGetAttribute(self, pool, attr, value):  # noqa: N802
    held = self.thresholds[pool.value - 0x90A]
    if attr != 4 or held is None:  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
      return 1
    value._obj.value = held
    return 0

  def cuMemPoolSetAttribute(self, pool, attr, value):  # noqa: N802
    assert attr == 4
    self.thresholds[pool.value - 0x90A] = value._obj.value
    self.calls.append(("keep", pool.value - 0x90A, value._obj.value))
    return 0

  def cuMemAllocAsync(self, ptr, size, stream):  # noqa: N802 (the CUDA name)
    ptr._obj.value = 0x7000_0000 + 0x1000 * sum(call[0] == "alloc" for call in self.calls)
    self.calls.append(("alloc", ptr._obj.value, size.value, stream.value))
    return 0

  def cuMemFreeAsync(self, ptr, stream):  # noqa: N802
    self.calls.append(("free", ptr.value, stream.value))
    return 0


class _Buffer:
  def __init__(self, ptr):
    self.__cuda_array_interface__ = {"data": (ptr, False)}


@pytest.mark.parametrize("fails", [False, True])
def test_scratch_is_stream_ordered_and_freed(monkeypatch, fails):
  """A kernel with global scratch (the forward's TMA descriptors) gets it from cuMemAllocAsync on XLA's stream,
  sized for the grid, through Triton's allocator in a copy of the context; it is freed on that stream after the
  launch, also when the launch raises, and the caller's own allocator stays as it was."""
  import types

  from triton.runtime import _allocation

  fake = _FakeCuda()
  monkeypatch.setattr(callback_launch, "_libcuda", lambda: fake)
  monkeypatch.setattr(scratch_pool, "_done", False)  # a process that has not launched a kernel with scratch yet
  seen = []

  def run(gx, gy, gz, stream, function, packed, hook_meta, enter, exit_, *args):
    # What Triton's CudaLauncher does with a kernel's global scratch (its size per program times the grid).
    buf = _allocation._allocator.get()(gx * gy * gz * 256, 128, stream)
    seen.append((buf.data_ptr(), stream, args))
    if fails:
      raise RuntimeError("launch failed")

  compiled = types.SimpleNamespace(metadata=types.SimpleNamespace(global_scratch_size=256), packed_metadata=None)
  kernel = types.SimpleNamespace(compiled=compiled, run=run, function=lambda: 99)
  ctx = types.SimpleNamespace(stream=0x5)
  before = _allocation._allocator.get()
  call = lambda: callback_launch._run_compiled(kernel, (3, 2, 1), ("a", 7), (0,), (), ctx, [_Buffer(0x200)],
                                               _Buffer(0x100))
  if fails:
    with pytest.raises(RuntimeError, match="launch failed"):
      call()
  else:
    call()
  assert seen == [(0x7000_0000, 0x5, (0x100, 7, 0x200))]
  assert fake.calls == [("keep", 0, scratch_pool.KEEP_BYTES), ("alloc", 0x7000_0000, 6 * 256, 0x5),
                        ("free", 0x7000_0000, 0x5)]
  assert _allocation._allocator.get() is before


def test_scratch_pool_is_kept_mapped_once_and_never_lowered(monkeypatch):
  """jqat.ffi.scratch_pool: the current pools' release thresholds are raised to KEEP_BYTES once per process; a
  higher one stays, a device whose pool cannot be read is skipped, and before the driver is initialized nothing
  is done (and it is tried again later)."""
  monkeypatch.setattr(scratch_pool, "_done", False)
  fake = _FakeCuda(thresholds=(0, None, 2 * scratch_pool.KEEP_BYTES, 1000), count_status=3)
  scratch_pool.keep_mapped(fake)
  assert fake.calls == [] and not scratch_pool._done
  fake.count_status = 0
  scratch_pool.keep_mapped(fake)
  scratch_pool.keep_mapped(fake)
  assert fake.calls == [("keep", 0, scratch_pool.KEEP_BYTES), ("keep", 3, scratch_pool.KEEP_BYTES)]
  assert fake.thresholds == [scratch_pool.KEEP_BYTES, None, 2 * scratch_pool.KEEP_BYTES, scratch_pool.KEEP_BYTES]


def _bits(x):
  x = np.asarray(x)
  return x.view(f"u{x.dtype.itemsize}")


def _kernel_outputs(q, k, v, do, opts):
  """Forward (O, O', lse) and backward (dQ, dK, dV) plans run by the JAX binding under jit: kernel outputs only."""

  def run(q, k, v, do):
    o, o_hp, lse = jax_launch.attention_forward(q, k, v, opts)
    return (o, o_hp, lse) + tuple(jax_launch.attention_backward(do, q, k, v, o_hp, lse, opts))

  return jax.jit(run)(q, k, v, do)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_callback_matches_jax_triton_gpu(launcher, causal):
  from jqat.ffi.options import DEFAULT_BLOCK_N, AttentionOptions, QATConfig

  q, k, v, do = _case(2, 200, 333, 4, 2, 128)
  do = do.astype(jnp.bfloat16)
  opts = AttentionOptions(128**-0.5, causal, DEFAULT_BLOCK_N, QATConfig())
  launcher("jax-triton")
  want = _kernel_outputs(q, k, v, do, opts)
  launcher("callback")
  got = _kernel_outputs(q, k, v, do, opts)
  f = lambda x: np.asarray(x.astype(jnp.float32))
  for name, g, e in zip(("O", "O'", "lse", "dQ", "dK", "dV"), got, want):
    print(f"{name}: {np.sum(_bits(g) != _bits(e))} of {g.size} elements differ from jax-triton's")
    assert_close(f(g), f(e), rel=BOUNDS[name], name=name)


@pytest.mark.gpu
def test_callback_public_api_matches_xla_gpu(launcher):
  """The public API under jit with the callback launcher: forward and gradients vs the XLA reference."""
  launcher("callback")
  q, k, v, w = _case(2, 257, 300, 4, 1, 64)
  _assert_triton_matches_xla(q, k, v, w)


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_forward_builds_for_sm90_with_descriptors_only_where_gated(monkeypatch, tmp_path):
  """The forward kernel builds for sm_90 (Triton's ptxas included) in every head-dim class, and makes TMA
  descriptors (global scratch) only at D_PAD = 128 and 256: Triton 3.6's ptxas died on the descriptor kernel at
  D = 16 and 32, and at D = 64 the call was slower on the H200; and not with segment ids at D_PAD = 256, where
  ptxas serialized the descriptor kernel's wgmma (an offline build of every head dim, mask and mode)."""
  from jqat.ffi import plan as plans
  from jqat.ffi.options import AttentionOptions

  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  target = plans.Target((9, 0))
  for d in (16, 64, 128, 256):
    q = plans.Tensor.dense((1, 256, 2, d), "bfloat16")
    plan = plans.attention_forward(q, q, q, AttentionOptions(d**-0.5), target)  # no mask: no exact walk to build
    (launch,) = [x for x in plan.launches if "attention_fwd" in x.name]
    kernel = _build(launch, *_launch_avals(plan, launch), target)
    assert kernel.asm["cubin"], d
    assert (kernel.metadata.global_scratch_size > 0) == (d >= 128), (d, kernel.metadata.global_scratch_size)
  q, seg = plans.Tensor.dense((1, 256, 2, 256), "bfloat16"), plans.Tensor.dense((1, 256), "int32")
  plan = plans.attention_forward(q, q, q, AttentionOptions(256**-0.5), target, masks=(None, None, seg, seg))
  (launch,) = [x for x in plan.launches if "attention_fwd" in x.name]
  assert _build(launch, *_launch_avals(plan, launch), target).metadata.global_scratch_size == 0


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_windowed_dq_above_128_is_not_serialized(monkeypatch, tmp_path):
  """The dQ kernel with a window at D = 192 builds for sm_90 and ptxas (``-v``, Triton's own) does not serialize
  its wgmma: the window's single walk did at every D_PAD > 128 (an offline build of every head dim), which cost that
  kernel 12% at D = 192 and 256 on the H200; wide heads now take the three walks."""
  from jqat.ffi import plan as plans
  from jqat.ffi.options import AttentionOptions

  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  target, d = plans.Target((9, 0)), 192
  q, lse = plans.Tensor.dense((1, 512, 2, d), "bfloat16"), plans.Tensor.dense((1, 2, 512), "float32")
  plan = plans.attention_backward(q, q, q, q, q, lse, AttentionOptions(d**-0.5, True, local_window_size=(255, 0)),
                                  target)
  (launch,) = [x for x in plan.launches if x.name.endswith("attention_bwd_dq")]
  report = _ptxas_report(_build(launch, *_launch_avals(plan, launch), target), tmp_path)
  assert "serialized" not in report, report


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_primal_at_d64_fits_four_programs_per_sm(monkeypatch, tmp_path):
  """The forward without residuals at D = 64 runs 64 rows on 4 warps, reads fq(Q) from the pass and is capped at 128
  registers, so four programs (16 warps) share an SM: 128 rows on 8 warps at 172 registers left one (16-18% slower
  on the H200), the uncapped kernel three (the capped one 1.5-2.3% faster). The cap reaches
  ptxas (Triton's maxnreg) and ptxas keeps the wgmma asynchronous under it; the training forward stays uncapped (at
  128 ptxas serialized its wgmma)."""
  import re

  from jqat.ffi import plan as plans
  from jqat.ffi.options import AttentionOptions

  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  target, q = plans.Target((9, 0)), plans.Tensor.dense((1, 256, 2, 64), "bfloat16")
  plan = plans.attention_forward(q, q, q, AttentionOptions(64**-0.5), target, residuals=False)
  (launch,) = [x for x in plan.launches if "attention_fwd" in x.name]
  assert (launch.constexprs["BLOCK_M"], launch.num_warps, launch.maxnreg) == (64, 4, 128)
  assert not launch.constexprs["QUANTIZE_Q"]
  kernel = _build(launch, *_launch_avals(plan, launch), target)
  assert ".maxnreg 128" in kernel.asm["ptx"]
  report = _ptxas_report(kernel, tmp_path)
  registers = int(re.search(r"Used (\d+) registers", report).group(1))
  assert registers <= 65536 // (4 * 4 * 32) // 8 * 8 and "serialized" not in report, report
  training = plans.attention_forward(q, q, q, AttentionOptions(64**-0.5), target)
  assert [x.maxnreg for x in training.launches if "attention_fwd" in x.name] == [0]


def _ptxas_report(kernel, tmp_path) -> str:
  """What Triton's own ptxas says (``-v``, sm_90a) of a compiled kernel's PTX: registers, spills, serialization."""
  import subprocess

  import triton

  ptx = tmp_path / "kernel.ptx"
  ptx.write_text(kernel.asm["ptx"])
  ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
  out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(tmp_path / "kernel.cubin")],
                       capture_output=True, text=True, check=True)
  return out.stderr


PRIMAL_CASES = {
    "full": dict(),
    "full-d64": dict(head_dim=64),  # GPU only: at D = 64 O alone is capped at 128 registers, the training forward not
    "full-d32": dict(head_dim=32),  # GPU only: the kernel rounds its own Q (no pass) at D <= 32 without masks
    "causal": dict(is_causal=True),
    "row": dict(p_scale="row"),
    "tensor-window-lengths": dict(qkv_scale="tensor", local_window_size=(9, 3), key_value_seq_lengths=(33,)),
    "no-fq-p": dict(quantize_p=False, is_causal=True),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.gpu] if "head_dim" in c else [])
                                  for n, c in PRIMAL_CASES.items()])
def test_primal_is_the_residual_forwards_output(launcher, monkeypatch, name):
  """jqat.attention where nothing differentiates runs the forward without residuals (no O' product, no lse): its
  O is, bit for bit, the O of attention_forward (the same arithmetic in the kernel; docs/NUMERICS.md), and within
  the reference's bound. The interpreter on the CPU (callback launcher), compiled kernels on the GPU."""
  from jqat.ffi.options import QATConfig

  if INTERPRET:
    launcher("callback")
    monkeypatch.setattr(dispatch, "triton_unavailable_reason", lambda: None)
    b, tq, tk, d = 1, 17, 40, 32
  else:
    b, tq, tk, d = 2, 300, 333, 128
  kw = dict(PRIMAL_CASES[name])
  d = kw.pop("head_dim", d)
  if "key_value_seq_lengths" in kw:
    kw["key_value_seq_lengths"] = jnp.full((b,), kw["key_value_seq_lengths"][0], jnp.int32)
  q, k, v, _ = _case(b, tq, tk, 4, 2, d, seed=len(name))
  cfg = {"config": QATConfig(quantize_p=False)} if kw.get("quantize_p") is False else {}
  fkw = {key: x for key, x in kw.items() if key != "quantize_p"}
  o = jax.jit(lambda q, k, v: jqat.attention(q, k, v, implementation="triton", **kw))(q, k, v)
  o_res = jax.jit(lambda q, k, v: jqat.attention_forward(q, k, v, implementation="triton", **fkw, **cfg)[0])(q, k, v)
  ref = jax.jit(lambda q, k, v: jqat.attention(q, k, v, implementation="xla", **kw))(q, k, v)
  bits = lambda x: np.asarray(x).view(np.uint16)
  np.testing.assert_array_equal(bits(o), bits(o_res))
  f = lambda x: np.asarray(x.astype(jnp.float32))
  assert_close(f(o), f(ref), rel=BOUNDS["O"], name="O")
