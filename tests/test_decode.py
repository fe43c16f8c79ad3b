"""The packed NVFP4 KV cache and decode attention (docs/NUMERICS.md, section 10) against NumPy oracles.

- The cache write is ``jqat.nvfp4.quantize`` bit for bit (oracle: ``pack_oracle``'s rounding), contiguous and
  paged, on the XLA path and in the kernel (interpreter on CPU, compiled on the GPU), and updates a donated cache
  in place.
- Decode is compared with ``oracle.decode_oracle`` (float64, the same tile walk and splits): one tile and many,
  ragged lengths down to Tq, causal and not, GQA/MQA, splits, paged = contiguous, the switches off.
- ``num_splits=1`` is the training forward's O on the dequantized cache.
- Bad input raises naming the argument, before anything runs.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, assert_reordered_equal
from oracle import decode_oracle, pack_oracle, unpack_oracle

import jqat
from jqat._src import dispatch
from jqat.ffi import callback_launch

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
# O against the float64 oracle: fq(P) codes on a rounding boundary may flip between FP32 and float64 (a 1/8 step of
# one probability of a tile, weighed by 1/l), plus BF16 rounding of O (2**-9); measured well below this.
O_BOUND = 2e-2


@pytest.fixture
def kernels(monkeypatch):
  """``implementation="triton"`` runs: compiled on a GPU, in Triton's interpreter through the callback launcher
  on CPU."""
  if INTERPRET:
    monkeypatch.setenv(callback_launch.ENV, "callback")
    monkeypatch.setattr(dispatch, "triton_unavailable_reason", lambda: None)
  return "triton"


def _values(shape, seed, dtype=jnp.bfloat16, outliers=False):
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  if outliers:  # blocks of very different magnitudes, an exact zero block, -0
    x[..., :16] *= 300.0
    x[..., 16:32] = 0.0
    x[..., 32] = -0.0
  return jnp.asarray(x, dtype)


def _paged(values, page_size, seed):
  """Pages of ``values [B, T, K, D]`` in a shuffled pool: ``(pool [B * T / page_size + 1, page_size, K, D], table)``."""
  b, t, kh, d = values.shape
  per_seq = t // page_size
  order = np.random.default_rng(seed).permutation(b * per_seq) + 1  # page 0 stays unused
  pool = np.zeros((b * per_seq + 1, page_size, kh, d), np.float32)
  pool[order] = np.asarray(values, np.float32).reshape(b * per_seq, page_size, kh, d)
  return jnp.asarray(pool, values.dtype), jnp.asarray(order.reshape(b, per_seq), jnp.int32)


def _filled(k, v, page_size=None, seed=0, impl="xla"):
  """Caches holding k, v [B, T, K, D] at positions 0..T-1, written by ``kv_cache_update``; with ``page_size``, paged."""
  b, t, kh, d = k.shape
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  if page_size is None:
    table = None
    kc, vc = jqat.init_kv_cache(k.shape), jqat.init_kv_cache(v.shape)
  else:
    pool, table = _paged(k, page_size, seed)
    kc, vc = jqat.init_kv_cache(pool.shape), jqat.init_kv_cache(pool.shape)
  kc, vc = jqat.kv_cache_update(kc, vc, k, v, pos, page_table=table, implementation=impl)
  return kc, vc, table


def _oracle_values(cache, table):
  codes, scales = (np.asarray(x) for x in cache)
  if table is not None:
    t = np.asarray(table)
    codes = codes[t].reshape((t.shape[0], -1) + codes.shape[2:])
    scales = scales[t].reshape((t.shape[0], -1) + scales.shape[2:])
  return unpack_oracle(codes, scales.view(np.uint8))


def _check_decode(q, kc, vc, lengths, table=None, *, impl="xla", num_splits=1, is_causal=True, block_n=64, **switches):
  out = jqat.decode_attention(q, kc, vc, lengths, page_table=table, num_splits=num_splits, is_causal=is_causal,
                              block_n=block_n, implementation=impl, **switches)
  assert out.shape == q.shape and out.dtype == q.dtype
  want = decode_oracle(np.asarray(q, np.float32), _oracle_values(kc, table), _oracle_values(vc, table),
                       np.asarray(lengths), scale=q.shape[-1] ** -0.5, block_n=block_n, num_splits=num_splits,
                       is_causal=is_causal, quantize_q=switches.get("quantize_qkv", True),
                       quantize_p=switches.get("quantize_p", True))
  assert_close(np.asarray(out, np.float32), want, rel=O_BOUND, name=f"O ({impl}, splits {num_splits})")
  return out


# ----------------------------------------------------------------------------- the cache write


def _assert_cache_holds(cache, x, positions, table=None, untouched=None):
  """The cache's rows at ``positions`` are ``pack_oracle(x)`` and jqat.nvfp4.quantize(x) bit for bit (codes of a
  NaN block: quantize's); every other row equals ``untouched`` (the cache before the write)."""
  codes, scales = (np.asarray(a).copy() for a in cache)
  scales = scales.view(np.uint8)
  q_codes, q_scales = (np.asarray(a) for a in jqat.nvfp4.quantize(x))
  o_codes, o_scales, nan = pack_oracle(np.asarray(x, np.float32))
  assert (q_scales.view(np.uint8) == o_scales.view(np.uint8)).all()
  finite_codes = np.where(np.repeat(nan, 8, axis=-1), 0, q_codes)
  assert (finite_codes == o_codes).all(), "quantize disagrees with the oracle"
  b, tn = positions.shape
  for bi in range(b):
    for t in range(tn):
      p = int(positions[bi, t])
      page, row = (bi, p) if table is None else (int(table[bi, p // codes.shape[1]]), p % codes.shape[1])
      assert (codes[page, row] == q_codes[bi, t]).all(), f"codes of (b={bi}, t={t}) at position {p}"
      assert (scales[page, row] == q_scales[bi, t].view(np.uint8)).all(), f"scales of (b={bi}, t={t})"
      if untouched is not None:
        codes[page, row] = untouched[0][page, row]
        scales[page, row] = untouched[1][page, row]
  if untouched is not None:
    assert (codes == untouched[0]).all() and (scales == untouched[1]).all(), "a row not written changed"


@pytest.mark.parametrize("impl", ["xla", "kernels"])
@pytest.mark.parametrize("paged", [False, True])
def test_write_is_quantize_bit_for_bit(request, impl, paged):
  impl = request.getfixturevalue("kernels") if impl == "kernels" else impl
  b, t, kh, d, tn = 2, 32, 2, 48, 3
  k_new = _values((b, tn, kh, d), 1, outliers=True)
  k_new = k_new.at[0, 1, 1, 20].set(jnp.nan).at[1, 0, 0, 5].set(jnp.inf).at[1, 2, 1, 40].set(-jnp.inf)
  v_new = _values((b, tn, kh, d), 2)
  positions = jnp.array([[5, 0, 31], [17, 9, 16]], jnp.int32)
  table = None
  shape = (b, t, kh, d)
  if paged:
    table = jnp.array([[3, 0, 7, 1], [6, 2, 5, 4]], jnp.int32)  # page size 8
    shape = (8, 8, kh, d)
  before = jqat.init_kv_cache(shape)
  before = (jnp.full_like(before[0], 0x5A), jax.lax.bitcast_convert_type(jnp.full(before[1].shape, 0x33, jnp.uint8),
                                                                        jnp.float8_e4m3fn))
  untouched = (np.asarray(before[0]), np.asarray(before[1]).view(np.uint8))
  kc, vc = jqat.kv_cache_update(before, before, k_new, v_new, positions, page_table=table, implementation=impl)
  _assert_cache_holds(kc, k_new, np.asarray(positions), None if table is None else np.asarray(table), untouched)
  _assert_cache_holds(vc, v_new, np.asarray(positions), None if table is None else np.asarray(table), untouched)


def test_write_in_place_when_donated():
  """Under jit with the caches donated the update aliases them: the compiled program allocates no new cache."""
  shape = (2, 4096, 2, 64)
  kc, vc = jqat.init_kv_cache(shape), jqat.init_kv_cache(shape)
  new = _values((2, 1, 2, 64), 3)
  pos = jnp.array([[7], [4095]], jnp.int32)
  step = jax.jit(lambda kc, vc, k, v, p: jqat.kv_cache_update(kc, vc, k, v, p), donate_argnums=(0, 1))
  hlo = step.lower(kc, vc, new, new, pos).compile().as_text()
  assert hlo.count("may-alias") + hlo.count("must-alias") >= 4, "the four cache buffers are not aliased"
  pointer = kc[0].unsafe_buffer_pointer()
  kc2, vc2 = step(kc, vc, new, new, pos)
  assert kc[0].is_deleted(), "the cache was not donated"
  assert kc2[0].unsafe_buffer_pointer() == pointer, "the updated codes do not reuse the cache's buffer"
  _assert_cache_holds(kc2, new, np.asarray(pos))


# ----------------------------------------------------------------------------- decode


@pytest.mark.parametrize("case", [
    # (B, Tq, N, K, T, D, lengths, splits, causal, block_n)
    (2, 3, 4, 1, 300, 64, (300, 3), 3, True, 64),  # MQA, many tiles and one tile, three runs, 3 new tokens causal
    (1, 4, 2, 2, 200, 32, (131,), 2, False, 32),  # not causal, small tiles
])
def test_decode_matches_oracle(case):
  b, tq, n, kh, t, d, lengths, splits, causal, block_n = case
  kc, vc, _ = _filled(_values((b, t, kh, d), 1), _values((b, t, kh, d), 2))
  _check_decode(_values((b, tq, n, d), 3), kc, vc, jnp.array(lengths, jnp.int32), num_splits=splits,
                is_causal=causal, block_n=block_n)


def test_decode_switches_off_matches_oracle():
  kc, vc, _ = _filled(_values((2, 100, 2, 64), 1), _values((2, 100, 2, 64), 2))
  _check_decode(_values((2, 2, 4, 64), 3), kc, vc, jnp.array([100, 50], jnp.int32), num_splits=2,
                quantize_qkv=False, quantize_p=False)


def test_one_split_is_the_training_forward():
  """num_splits=1: O of jqat.attention's forward on the dequantized cache (the new tokens bottom-right causal)."""
  b, tq, t = 1, 3, 150
  kc, vc, _ = _filled(_values((b, t, 2, 64), 1), _values((b, t, 2, 64), 2))
  q = _values((b, tq, 4, 64), 3)
  lengths = (130,)
  out = jqat.decode_attention(q, kc, vc, jnp.array(lengths, jnp.int32), num_splits=1)
  k, v = jqat.nvfp4.dequantize(*kc), jqat.nvfp4.dequantize(*vc)
  for bi, n_keys in enumerate(lengths):
    want = jqat.attention(q[bi:bi + 1], k[bi:bi + 1, :n_keys], v[bi:bi + 1, :n_keys], is_causal=True,
                          causal_alignment="bottom_right")
    assert_reordered_equal(np.asarray(out[bi:bi + 1], np.float32), np.asarray(want, np.float32), dtype=jnp.bfloat16,
                           name=f"sequence {bi}")


def test_paged_equals_contiguous():
  k, v = _values((2, 256, 2, 64), 1), _values((2, 256, 2, 64), 2)
  q = _values((2, 2, 4, 64), 3)
  lengths = jnp.array([256, 100], jnp.int32)
  kc, vc, _ = _filled(k, v)
  pc, pv, table = _filled(k, v, page_size=64, seed=4)
  flat = jqat.decode_attention(q, kc, vc, lengths, num_splits=2)
  paged = jqat.decode_attention(q, pc, pv, lengths, page_table=table, num_splits=2)
  assert_reordered_equal(np.asarray(paged, np.float32), np.asarray(flat, np.float32), dtype=jnp.bfloat16)


@pytest.mark.parametrize("paged", [False, True])
def test_kernels_match_oracle(kernels, paged):
  """The decode kernels (interpreter on CPU, compiled on a GPU), GQA, ragged lengths, one and several runs."""
  b, tq, n, kh, t, d = 2, 2, 4, 2, 192, 48
  kc, vc, table = _filled(_values((b, t, kh, d), 1), _values((b, t, kh, d), 2), page_size=64 if paged else None)
  q = _values((b, tq, n, d), 3)
  for splits in (1, 2):
    _check_decode(q, kc, vc, jnp.array([192, 65], jnp.int32), table, impl=kernels, num_splits=splits)


def test_decode_kernel_choice(monkeypatch):
  """auto: the Gluon split kernel on sm_90 where it takes the launch, else the Triton kernel (the interpreter always);
  gluon: the Gluon kernel or a ValueError naming what it takes; an unknown name raises."""
  from jqat.ffi import plan as plans
  from jqat.ffi.options import DecodeOptions, QATConfig

  dense = plans.Tensor.dense
  sm90, ada, cpu = plans.Target((9, 0)), plans.Target((8, 9)), plans.Target(None, interpret=True)

  def choose(d=128, tq=1, n=32, kh=8, page=0, target=sm90, choice=None, code_strides=None, **opts):
    lead = (64, page) if page else (2, 4096)
    codes = dense(lead + (kh, d // 2), "uint8")
    if code_strides:
      codes = plans.Tensor(codes.shape, "uint8", code_strides)
    scales = dense(lead + (kh, d // 16), "float8_e4m3fn")
    return plans.decode_kernel(dense((2, tq, n, d), "bfloat16"), codes, scales, codes, scales,
                               DecodeOptions(scale=0.1, **opts), target, paged=bool(page), choice=choice)

  monkeypatch.delenv(plans.DECODE_KERNEL_ENV, raising=False)
  assert choose() == "gluon" and choose(d=64, tq=4, n=16) == "gluon" and choose(page=128) == "gluon"
  assert choose(page=16) == "triton" and choose(d=256) == "triton" and choose(tq=5) == "triton"
  assert choose(block_n=32) == "triton" and choose(config=QATConfig(False, False, True, True)) == "triton"
  assert choose(code_strides=(4096 * 8 * 72, 8 * 72, 72, 1)) == "triton"  # rows of 72 bytes: no 16-byte copies
  assert choose(target=ada) == "triton" and choose(target=cpu) == "triton"
  assert choose(target=ada, choice="gluon") == "gluon" and choose(target=cpu, choice="gluon") == "triton"
  assert choose(choice="triton") == "triton"
  with pytest.raises(ValueError, match="at most 16 query rows"):
    choose(tq=8, choice="gluon")
  monkeypatch.setenv(plans.DECODE_KERNEL_ENV, "triton")
  assert choose() == "triton"
  monkeypatch.setenv(plans.DECODE_KERNEL_ENV, "cuda")
  with pytest.raises(ValueError, match="JQAT_DECODE_KERNEL must be one of"):
    choose()


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_gluon_kernel_builds_for_sm90(monkeypatch, tmp_path):
  """The Gluon split kernel builds for sm_90 at D = 64 and 128, 8 and 16 rows, contiguous and paged, groups of 2 and
  1 KV heads a program (and 4, the measurements' knob), with no spills;
  its layout conversions inside the KV loop are asserted free (``assert_trivial``) when it is traced, so a build
  proves that no operand moves between threads there."""
  import re
  import subprocess

  import triton

  from jqat.ffi import callback_launch
  from jqat.ffi import plan as plans
  from jqat.ffi.options import DecodeOptions

  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  dense = plans.Tensor.dense
  from jqat.kernels_triton import decode_gluon

  for d, tq, page, kh, knob in ((128, 1, 0, 8, None), (128, 4, 64, 8, None), (64, 2, 0, 2, None), (128, 1, 0, 1, None),
                                (64, 1, 64, 2, None), (128, 1, 0, 8, 4)):
    monkeypatch.setattr(decode_gluon, "KV_GROUP", knob)
    lead = (33, page) if page else (2, 1024)
    codes, scales = dense(lead + (kh, d // 2), "uint8"), dense(lead + (kh, d // 16), "float8_e4m3fn")
    table = dense((2, 16), "int32") if page else None
    plan = plans.decode_attention(dense((2, tq, 4 * kh, d), "bfloat16"), codes, scales, codes, scales,
                                  dense((2,), "int32"), DecodeOptions(scale=0.1, num_splits=2), plans.Target((9, 0)),
                                  page_table=table, kernel="gluon")
    launch = plan.launches[0]
    assert launch.name == "jqat_decode_split_gluon" and launch.constexprs["BLOCK_M"] == (8 if 4 * tq <= 8 else 16)
    assert launch.constexprs["PACK"] == (4 * tq <= 4)  # S^T packed at up to half of BLOCK_M's rows
    group = min(kh, knob or 2)  # a program per group of KV heads, a warp each
    assert (launch.constexprs["KV_GROUP"], launch.num_warps, launch.grid) == (group, group, (2 * kh // group, 2))
    types = tuple("*" + callback_launch._POINTER_TYPES[plan.buffers[a.name].dtype] if isinstance(a, plans.Ref)
                  else "fp32" if isinstance(a, float) else "i32" for a in launch.args)
    types += tuple("*" + callback_launch._POINTER_TYPES[plan.buffers[o].dtype] for o in launch.outputs)
    kernel = callback_launch.build(launch.kernel, types, (), tuple(launch.constexprs.items()), launch.num_warps,
                                   launch.num_stages, (9, 0))
    path = tmp_path / "k.cubin"
    path.write_bytes(kernel.asm["cubin"])
    cuobjdump = str(triton.__path__[0]) + "/backends/nvidia/bin/cuobjdump"
    usage = subprocess.run([cuobjdump, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"STACK:0\b", usage), (d, tq, page, usage)


def test_gluon_kv_group_divides_the_kv_heads(monkeypatch):
  from jqat.kernels_triton import decode_gluon

  assert [decode_gluon.kv_group(k) for k in (1, 2, 3, 4, 6, 8, 12, 32)] == [1, 2, 1, 2, 2, 2, 2, 2]
  monkeypatch.setattr(decode_gluon, "KV_GROUP", 4)  # the measurements' knob: still a divisor of the KV heads
  assert [decode_gluon.kv_group(k) for k in (1, 2, 3, 4, 6, 8, 12, 32)] == [1, 2, 1, 4, 2, 4, 4, 4]


def test_default_splits_are_a_function_of_shapes():
  from jqat.ffi.options import default_num_splits

  assert default_num_splits(8, 8, 32768, 64) == 16
  assert default_num_splits(1, 8, 131072, 64) == 128
  assert default_num_splits(1, 1, 1 << 20, 64) == 128  # MAX_SPLITS
  assert default_num_splits(64, 1, 4096, 64) == 8
  assert default_num_splits(32, 8, 64, 64) == 1


def test_not_differentiable():
  kc, vc, _ = _filled(_values((1, 16, 1, 32), 1), _values((1, 16, 1, 32), 2))
  q = _values((1, 1, 1, 32), 3)
  with pytest.raises(NotImplementedError, match="no derivative"):
    jax.grad(lambda q: jqat.decode_attention(q, kc, vc, jnp.array([16], jnp.int32)).astype(jnp.float32).sum())(q)


# ----------------------------------------------------------------------------- bad input


def _bad_cases():
  q = _values((2, 1, 4, 64), 0)
  kc = jqat.init_kv_cache((2, 32, 2, 64))
  lengths = jnp.array([5, 6], jnp.int32)
  bad_scales = (kc[0], kc[1].astype(jnp.float32))
  return [
      ("k_cache scales must be float8_e4m3fn", dict(k_cache=bad_scales)),
      ("k_cache codes must be uint8", dict(k_cache=(kc[0].astype(jnp.int32), kc[1]))),
      ("k_cache must be a pair", dict(k_cache=kc[0])),
      ("v_cache must have the shape of k_cache", dict(v_cache=jqat.init_kv_cache((2, 16, 2, 64)))),
      ("k_cache holds head dim 64", dict(query=_values((2, 1, 4, 32), 0))),
      ("1 to 64 new tokens", dict(query=_values((2, 65, 4, 64), 0), kv_lengths=jnp.array([65, 65], jnp.int32))),
      ("multiple of the cache's KV heads", dict(query=_values((2, 1, 3, 64), 0))),
      ("kv_lengths must be in", dict(kv_lengths=jnp.array([33, 5], jnp.int32))),
      ("kv_lengths must be in", dict(query=_values((2, 4, 4, 64), 0), kv_lengths=jnp.array([3, 5], jnp.int32))),
      ("kv_lengths must have shape", dict(kv_lengths=jnp.array([5], jnp.int32))),
      ("kv_lengths must be an int32 array", dict(kv_lengths=jnp.array([5.0, 6.0]))),
      ("kv_lengths must fit int32", dict(kv_lengths=np.array([2**32 + 5, 6], np.int64))),
      ("page_table entries must be page ids", dict(page_table=jnp.array([[0], [2]], jnp.int32))),
      ("page_table must be int32", dict(page_table=jnp.array([0, 1], jnp.int32))),
      ("num_splits must be in", dict(num_splits=0)),
      (r"num_splits must be in \[1, 128\]", dict(num_splits=129)),
      ("num_splits must be None or an int", dict(num_splits=2.0)),
      ("block_n must be one of", dict(block_n=48)),
      ("is_causal must be a bool", dict(is_causal="yes")),
      ("p_scale must be one of", dict(p_scale="tensor")),
  ], dict(query=q, k_cache=kc, v_cache=kc, kv_lengths=lengths)


@pytest.mark.parametrize("index", range(19))
def test_decode_bad_input_names_the_argument(index):
  cases, good = _bad_cases()
  match, change = cases[index]
  args = {**good, **change}
  with pytest.raises((TypeError, ValueError), match=match):
    jqat.decode_attention(args.pop("query"), args.pop("k_cache"), args.pop("v_cache"), args.pop("kv_lengths"), **args)


def test_update_bad_input_leaves_the_cache():
  kc = jqat.init_kv_cache((2, 32, 2, 64))
  new = _values((2, 1, 2, 64), 0)
  with pytest.raises(ValueError, match=r"positions must be in \[0, 32\)"):
    jqat.kv_cache_update(kc, kc, new, new, jnp.array([[3], [32]], jnp.int32))
  with pytest.raises(ValueError, match="positions must have shape"):
    jqat.kv_cache_update(kc, kc, new, new, jnp.array([3, 4], jnp.int32))
  with pytest.raises(ValueError, match="k_cache holds head dim 64"):
    jqat.kv_cache_update(kc, kc, _values((2, 1, 2, 32), 0), _values((2, 1, 2, 32), 0), jnp.zeros((2, 1), jnp.int32))
  with pytest.raises(ValueError, match="page_table entries"):
    jqat.kv_cache_update(kc, kc, new, new, jnp.zeros((2, 1), jnp.int32), page_table=jnp.array([[0], [2]], jnp.int32))
  assert not np.asarray(kc[0]).any(), "a failed update wrote to the cache"


def test_out_of_range_writes_are_dropped_under_jit():
  kc = jqat.init_kv_cache((2, 8, 1, 32))
  new = _values((2, 2, 1, 32), 0)
  step = jax.jit(lambda c, x, p: jqat.kv_cache_update(c, c, x, x, p)[0])
  codes, _ = step(kc, new, jnp.array([[3, 8], [-1, 2]], jnp.int32))
  written = np.asarray(codes).reshape(2, 8, -1).any(-1)
  assert written.sum() == 2 and written[0, 3] and written[1, 2]


# ----------------------------------------------------------------------------- GPU


_GPU_CASES = [
    # (B, Tq, N, K, T, D, splits, paged page size, switches)
    (4, 1, 32, 8, 4096, 128, 8, None, {}),
    (4, 4, 32, 8, 4096, 128, 4, 128, {}),
    (3, 1, 8, 1, 3008, 128, 5, 64, {}),
    (2, 64, 8, 2, 2048, 64, 2, None, {}),
    (2, 2, 4, 4, 1024, 256, 1, None, {}),
    (2, 1, 16, 4, 2048, 96, 3, 16, {}),
    (2, 3, 8, 2, 2048, 128, 4, None, dict(quantize_qkv=False, quantize_p=False)),
]
# The cases the Gluon split kernel takes (D 64 or 128, at most 16 query rows, pages of a multiple of 64), and more of
# its own: 16 rows, D = 64 paged, not causal, p_scale="row" (checked against the Triton kernel: the oracle has no
# row scaling).
_GLUON_CASES = [c for c in _GPU_CASES if c[5] in (64, 128) and c[2] // c[3] * c[1] <= 16 and not c[8]] + [
    (2, 4, 16, 4, 2048, 128, 1, None, {}),
    (3, 2, 16, 2, 1984, 64, 3, 64, {}),
    (2, 1, 32, 8, 1536, 128, 2, None, dict(is_causal=False)),
    # at most 4 rows: S^T packed (decode_gluon.packs), with the causal mask among new tokens, one split, D = 64 paged
    (2, 4, 8, 8, 2048, 64, 3, 64, {}),
    (3, 2, 16, 8, 1536, 128, 1, None, {}),
    (2, 3, 8, 8, 1024, 64, 2, None, {}),
]


@pytest.fixture
def decode_kernel(monkeypatch):
  """Forces the decode split kernel (``JQAT_DECODE_KERNEL``) for one test."""
  from jqat.ffi import plan as plans

  def force(name):
    monkeypatch.setenv(plans.DECODE_KERNEL_ENV, name)
  return force


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES)
def test_kernels_match_oracle_gpu(case, decode_kernel):
  """The Triton split kernel (forced) against the oracle."""
  decode_kernel("triton")
  _check_gpu_case(case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GLUON_CASES)
def test_gluon_kernel_matches_oracle_gpu(case, decode_kernel):
  """The Gluon split kernel (forced) against the oracle, within the Triton kernel's bound."""
  decode_kernel("gluon")
  _check_gpu_case(case)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("p_scale", ["block", "row"])
def test_gluon_kernel_matches_triton_kernel_gpu(paged, p_scale, decode_kernel):
  """The two split kernels compute the same function: O within FP32 summation order of each other (the products' and
  l's sums run in another order; fq(P) codes on a rounding boundary may flip, as between any two schedules), with
  p_scale="row" too, which the oracle does not model."""
  b, tq, n, kh, t, d = 3, 2, 16, 4, 2048, 128
  kc, vc, table = _filled(_values((b, t, kh, d), 1), _values((b, t, kh, d), 2), page_size=64 if paged else None,
                          impl="triton")
  q = _values((b, tq, n, d), 3)
  lengths = jnp.array([t, 1000, 65], jnp.int32)
  outs = {}
  for name in ("triton", "gluon"):
    decode_kernel(name)
    outs[name] = np.asarray(jqat.decode_attention(q, kc, vc, lengths, page_table=table, num_splits=4, p_scale=p_scale,
                                                  implementation="triton"), np.float32)
  assert np.isfinite(outs["gluon"]).all()
  assert_close(outs["gluon"], outs["triton"], rel=O_BOUND / 4, name=f"gluon vs triton ({p_scale}, paged {paged})")


@pytest.mark.gpu
def test_gluon_kernel_is_a_custom_call_gpu(decode_kernel, monkeypatch):
  """Under jax.jit the Gluon split kernel is a jax-triton custom call like the combine launch (jqat's wrapper of
  jax-triton compiles Gluon kernels), not a host callback: the default launcher keeps partitioning rules and CUDA
  graphs for it."""
  from jqat.ffi import callback_launch

  monkeypatch.delenv(callback_launch.ENV, raising=False)
  decode_kernel("gluon")
  b, t, kh, d = 2, 1024, 2, 128
  kc, vc = jqat.init_kv_cache((b, t, kh, d)), jqat.init_kv_cache((b, t, kh, d))
  q, lengths = _values((b, 1, 8, d), 3), jnp.full((b,), t, jnp.int32)
  text = jax.jit(lambda q, kc, vc, n: jqat.decode_attention(q, kc, vc, n, num_splits=2, implementation="triton")
                 ).lower(q, kc, vc, lengths).as_text()
  assert text.count("triton_kernel_call") >= 2 and "callback" not in text


def _check_gpu_case(case):
  b, tq, n, kh, t, d, splits, page_size, switches = case
  switches = dict(switches)
  causal = switches.pop("is_causal", True)
  kc, vc, table = _filled(_values((b, t, kh, d), 1), _values((b, t, kh, d), 2), page_size=page_size,
                          impl="triton")
  lengths = jnp.asarray(np.random.default_rng(5).integers(tq, t + 1, b).astype(np.int32)).at[0].set(t)
  _check_decode(_values((b, tq, n, d), 3), kc, vc, lengths, table, impl="triton", num_splits=splits,
                is_causal=causal, **switches)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
def test_kernel_write_is_quantize_bit_for_bit_gpu(paged):
  b, t, kh, d = 4, 1024, 8, 128
  k, v = _values((b, t, kh, d), 1, outliers=True), _values((b, t, kh, d), 2)
  kc, vc, table = _filled(k, v, page_size=64 if paged else None, impl="triton")
  pos = np.broadcast_to(np.arange(t), (b, t))
  _assert_cache_holds(kc, k, pos, None if table is None else np.asarray(table))
  _assert_cache_holds(vc, v, pos, None if table is None else np.asarray(table))


@pytest.mark.gpu
def test_kernel_write_in_place_when_donated_gpu():
  shape = (8, 8192, 8, 128)
  kc, vc = jqat.init_kv_cache(shape), jqat.init_kv_cache(shape)
  new = _values((8, 1, 8, 128), 3)
  pos = jnp.full((8, 1), 100, jnp.int32)
  step = jax.jit(lambda kc, vc, k, v, p: jqat.kv_cache_update(kc, vc, k, v, p, implementation="triton"),
                 donate_argnums=(0, 1))
  compiled = step.lower(kc, vc, new, new, pos).compile()
  cache_bytes = sum(x.nbytes for x in (*kc, *vc))
  temp = compiled.memory_analysis().temp_size_in_bytes
  assert temp < cache_bytes / 100, f"the update allocates {temp} bytes of temporaries: a copy of the cache"
  pointers = [x.unsafe_buffer_pointer() for x in (*kc, *vc)]
  kc, vc = compiled(kc, vc, new, new, pos)
  assert [x.unsafe_buffer_pointer() for x in (*kc, *vc)] == pointers, "the cache buffers were not reused"


# ----------------------------------------------------------------------------- torch


def _torch_cache(cache, device="cpu"):
  import torch

  codes, scales = (np.asarray(x) for x in cache)
  return (torch.from_numpy(codes.copy()).to(device),
          torch.from_numpy(scales.view(np.uint8).copy()).view(torch.float8_e4m3fn).to(device))


def test_torch_matches_jax_on_cpu():
  """jqat.torch's decode and cache write on CPU tensors run the XLA path: the JAX API's bits."""
  import torch

  import jqat.torch as jt

  b, t, kh, d, n, tq = 2, 64, 2, 32, 4, 2
  k, v = _values((b, t, kh, d), 1), _values((b, t, kh, d), 2)
  empty = jqat.init_kv_cache((b, t, kh, d))
  kc, vc = _torch_cache(empty), _torch_cache(empty)
  to_bhsd = lambda x: torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).transpose(1, 2).contiguous()
  pos = torch.arange(t, dtype=torch.int32).expand(b, t).contiguous()
  version = kc[0]._version
  assert jt.kv_cache_update(kc, vc, to_bhsd(k), to_bhsd(v), pos) == (kc, vc)
  jkc, jvc, _ = _filled(k, v)
  assert (kc[0].numpy() == np.asarray(jkc[0])).all() and (vc[1].view(torch.uint8).numpy()
                                                          == np.asarray(jvc[1]).view(np.uint8)).all()
  assert kc[0]._version > version, "the in-place write did not bump the version counter"
  q = _values((b, tq, n, d), 3)
  lengths = jnp.array([64, 40], jnp.int32)
  got = jt.decode_attention(to_bhsd(q), kc, vc, torch.tensor([64, 40], dtype=torch.int32), num_splits=2)
  want = jqat.decode_attention(q, jkc, jvc, lengths, num_splits=2, implementation="xla")
  assert (got.transpose(1, 2).float().numpy() == np.asarray(want, np.float32)).all()
  with pytest.raises(ValueError, match=r"positions must be in \[0, 64\)"):
    jt.kv_cache_update(kc, vc, to_bhsd(k)[:, :, :1], to_bhsd(v)[:, :, :1], torch.full((b, 1), 96, dtype=torch.int32))
  with pytest.raises(ValueError, match="positions must be int32"):
    jt.kv_cache_update(kc, vc, to_bhsd(k), to_bhsd(v), pos.long())


def test_torch_bad_out_and_lengths_name_the_argument():
  """jqat.torch.decode_attention's ``out`` (written in place by the kernels, so a wrong one would be written past
  its end) and ``kv_lengths`` (read per sequence) are checked before anything runs; a refused ``out`` is untouched."""
  import torch

  import jqat.torch as jt

  b, t, kh, d, n, tq = 2, 64, 2, 32, 4, 1
  kc, vc = (_torch_cache(jqat.init_kv_cache((b, t, kh, d))) for _ in range(2))
  q = torch.zeros(b, n, tq, d, dtype=torch.bfloat16)
  lengths = torch.full((b,), 8, dtype=torch.int32)
  good = torch.empty(b, n, tq, d, dtype=torch.bfloat16)
  assert jt.decode_attention(q, kc, vc, lengths, out=good) is good
  grad = torch.zeros(b, n, tq, d, dtype=torch.bfloat16, requires_grad=True)
  cases = [
      (dict(out=torch.full((b, n, tq + 1, d), 7.0, dtype=torch.bfloat16)), ValueError, r"out must be .* of shape"),
      (dict(out=torch.full((b, n, tq, d), 7.0)), ValueError, r"out must be torch.bfloat16"),
      (dict(out=torch.full((b, n, tq, 2 * d), 7.0, dtype=torch.bfloat16)[..., ::2]), NotImplementedError,
       "out must be dense"),
      (dict(out=torch.full((1, n, tq, d), 7.0, dtype=torch.bfloat16).expand(b, n, tq, d)), NotImplementedError,
       "out must be dense"),
      (dict(out=grad), ValueError, "out must not require grad"),
      (dict(out=q), ValueError, "out overlaps q"),
      (dict(out=[good]), TypeError, "out must be a torch.Tensor"),
      (dict(kv_lengths=torch.full((b + 1,), 8, dtype=torch.int32)), ValueError, r"kv_lengths must have shape \(2,\)"),
  ]
  for kw, exc, match in cases:
    args = dict(kv_lengths=lengths) | kw
    before = kw["out"].clone() if isinstance(kw.get("out"), torch.Tensor) else None
    with pytest.raises(exc, match=match):
      jt.decode_attention(q, kc, vc, args.pop("kv_lengths"), **args)
    if before is not None:
      assert torch.equal(kw["out"], before), f"{match}: the refused out was written"


@pytest.mark.gpu
def test_torch_strided_inputs_gpu():
  """Inputs the kernels cannot index as given, through jqat.torch on CUDA: a page table that is a column slice of a
  wider one (a serving system's block-table prefix), new keys broadcast along D, a transposed query. Each gives the
  caches and output of its contiguous copy, bit for bit (the same kernels on the same values): before, the slice was
  read with the wide table's row length (another page written), the broadcast keys read past their storage."""
  import torch

  import jqat.torch as jt

  b, t, kh, d, n, page = 2, 256, 2, 64, 4, 64
  dev = "cuda"
  per_seq = t // page
  wide = torch.randperm(2 * b * per_seq, device=dev, dtype=torch.int32)[: b * 2 * per_seq].view(b, 2 * per_seq)
  table = wide[:, :per_seq]
  pool = lambda: _torch_cache(jqat.init_kv_cache((2 * b * per_seq, page, kh, d)), dev)
  new = torch.randn(b, kh, 3, 1, device=dev, dtype=torch.bfloat16).expand(b, kh, 3, d)
  pos = torch.tensor([[5, 6, 7]] * b, dtype=torch.int32, device=dev)
  caches = {}
  for name, tbl, k_new in (("given", table, new), ("contiguous", table.contiguous(), new.contiguous())):
    kc, vc = pool(), pool()
    jt.kv_cache_update(kc, vc, k_new, k_new, pos, page_table=tbl)
    caches[name] = (kc, vc, tbl)
  for a, e in zip((*caches["given"][0], *caches["given"][1]), (*caches["contiguous"][0], *caches["contiguous"][1])):
    assert torch.equal(a.view(torch.uint8), e.view(torch.uint8)), "the sliced table or broadcast keys wrote elsewhere"
  kc, vc, _ = caches["contiguous"]
  lengths = torch.full((b,), 8, dtype=torch.int32, device=dev)
  q = torch.randn(b, n, d, 2, device=dev, dtype=torch.bfloat16).transpose(2, 3)  # [B, N, 2, D], last axis strided
  assert q.stride(-1) == 2
  got = jt.decode_attention(q, kc, vc, lengths, page_table=table)
  want = jt.decode_attention(q.contiguous(), kc, vc, lengths, page_table=table.contiguous())
  assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["triton", "gluon"])
def test_torch_kernels_and_cuda_graph_gpu(kernel, decode_kernel):
  """jqat.torch on CUDA: the kernels against the oracle, and a captured decode step (write + attend) replayed with
  new inputs gives the eager result."""
  import torch

  import jqat.torch as jt

  decode_kernel(kernel)
  b, t, kh, d, n = 4, 2048, 8, 128, 32
  dev = "cuda"
  k, v = _values((b, t, kh, d), 1), _values((b, t, kh, d), 2)
  jkc, jvc, _ = _filled(k, v, impl="triton")
  kc, vc = _torch_cache(jkc, dev), _torch_cache(jvc, dev)
  lengths = torch.full((b,), t, dtype=torch.int32, device=dev)
  q = torch.randn(b, n, 1, d, device=dev, dtype=torch.bfloat16)
  got = jt.decode_attention(q, kc, vc, lengths, num_splits=4)
  want = decode_oracle(q.transpose(1, 2).float().cpu().numpy(), _oracle_values(jkc, None), _oracle_values(jvc, None),
                       np.full(b, t), scale=d ** -0.5, block_n=64, num_splits=4)
  assert_close(got.transpose(1, 2).float().cpu().numpy(), want, rel=O_BOUND, name="torch O")
  new = torch.randn(b, kh, 1, d, device=dev, dtype=torch.bfloat16)
  pos = torch.full((b, 1), t - 1, dtype=torch.int32, device=dev)
  out = torch.empty_like(q)

  def step():
    jt.kv_cache_update(kc, vc, new, new, pos)
    jt.decode_attention(q, kc, vc, lengths, num_splits=4, out=out)

  step()  # compiles
  torch.cuda.synchronize()
  graph = torch.cuda.CUDAGraph()
  with torch.cuda.graph(graph):
    step()
  q.copy_(torch.randn_like(q))
  new.copy_(torch.randn_like(new))
  graph.replay()
  torch.cuda.synchronize()
  replayed = out.clone()
  step()
  torch.cuda.synchronize()
  assert torch.equal(replayed, out), "the replayed step differs from the eager one"
