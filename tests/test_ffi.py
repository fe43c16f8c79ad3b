"""The jax-triton wrapper of ``jqat/ffi/triton_call.py`` against a stand-in jax_triton (CPU).

jax-triton only imports where jaxlib has GPU support, so these tests put small
fake modules in its place and check what jqat's layer adds: the restored
TRITON_CACHE_DIR, FP32 scalars, the output keyword of either API generation,
and the on-disk kernel cache: a second "process" loads instead of compiling; a
planted pickle, another key's entry or a tampered entry is never used (the kernel
is compiled again and the entry repaired); a directory others can write is
refused; concurrent compiles each store their own kernel. One test runs jax-triton
0.3.1's real factory (a Triton compile to PTX needs no GPU) through the cache.
"""

import concurrent.futures
import json
import os
import pickle
import shutil
import stat
import sys
import threading
import types
import warnings

import numpy as np
import pytest

from jqat.ffi import triton_call as tc


class _Kernel:
  def __init__(self, *ctor_args):
    self.ctor_args = ctor_args


# Like jax_triton.triton_lib's factory: a module-level function that reaches the kernel
# class through its module's global ``triton_kernel_call_lib`` (exec'd into the fake module).
_FAKE_FACTORY = """
def get_or_create_triton_kernel(backend_init_func, platform, fn, arg_dtypes, scalar_args, *, num_warps, num_stages,
                                num_ctas, compute_capability, enable_fp_fusion, metaparams, dump):
  compiled.append(fn)
  before_construct()
  kernel = triton_kernel_call_lib.TritonKernel(fn.name, num_warps, 1, 0, "ptx of " + fn.name, "ttir", 90)
  scalars = {i for i, _, _ in scalar_args}
  return kernel, {(i,): [] if i in scalars else [["tt.divisibility", 16]] for i in range(len(arg_dtypes))}
"""


def _fake_jax_triton(monkeypatch, out_keyword="out_shape"):
  compiled = []
  calls = []
  kernel_lib = types.SimpleNamespace(TritonKernel=_Kernel, get_compute_capability=lambda device: 90)
  lib = types.ModuleType("jax_triton.triton_lib")
  lib.triton_kernel_call_lib = kernel_lib
  lib.compiled = compiled
  lib.before_construct = lambda: None
  exec(_FAKE_FACTORY, vars(lib))  # noqa: S102  (a fixed string: the fake module's source)
  jt = types.ModuleType("jax_triton")
  jt.__version__ = "fake"
  jt.triton_lib = lib

  def triton_call(*args, kernel, grid, name="", num_warps=None, num_stages=None, input_output_aliases=None,
                  **kwargs):
    calls.append((args, kwargs))
    return "result"

  if out_keyword == "out_type":
    def triton_call_new(*args, kernel, out_type=None, grid, name="", num_warps=None, num_stages=None,
                        input_output_aliases=None, **kwargs):
      return triton_call(*args, kernel=kernel, grid=grid, out_type=out_type, **kwargs)
    jt.triton_call = triton_call_new
  else:
    def triton_call_old(*args, kernel, out_shape, grid, name="", num_warps=None, num_stages=None,
                        input_output_aliases=None, **kwargs):
      return triton_call(*args, kernel=kernel, grid=grid, out_shape=out_shape, **kwargs)
    jt.triton_call = triton_call_old

  def importing():  # jax-triton 0.3.1 empties TRITON_CACHE_DIR on import
    os.environ["TRITON_CACHE_DIR"] = ""
    return jt

  monkeypatch.setitem(sys.modules, "jax_triton", jt)
  monkeypatch.setitem(sys.modules, "jax_triton.triton_lib", lib)
  tc.jax_triton.cache_clear()
  tc._out_keyword.cache_clear()
  return jt, lib, compiled, calls, importing


@pytest.mark.parametrize("out_keyword", ["out_shape", "out_type"])
def test_wrapper_restores_cache_dir_and_passes_fp32_scalars(monkeypatch, tmp_path, out_keyword):
  _, _, _, calls, importing = _fake_jax_triton(monkeypatch, out_keyword)
  monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path / "kernels"))
  real_import = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__

  def fake_import(name, *a, **k):
    return importing() if name == "jax_triton" else real_import(name, *a, **k)

  monkeypatch.setattr("builtins.__import__", fake_import)
  assert tc.triton_call(1.5, 3, kernel=object(), out_shape="S", grid=(1,)) == "result"
  monkeypatch.setattr("builtins.__import__", real_import)
  assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")  # restored after the import emptied it
  args, kwargs = calls[-1]
  assert isinstance(args[0], np.float32) and args[1] == 3 and isinstance(args[1], int)
  assert kwargs[out_keyword] == "S"
  tc.jax_triton.cache_clear()


def test_wrapper_passes_a_register_cap_only_to_jqats_factory(monkeypatch, tmp_path):
  """maxnreg rides to the kernel factory as jqat's metaparameter only where jqat's wrapper of the factory takes it
  out again (jax-triton 0.3.1's internals); with any other factory it is a clear error, nothing is called."""
  jt, lib, _, calls, _ = _fake_jax_triton(monkeypatch)
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  tc.jax_triton()
  lib.get_or_create_triton_kernel._jqat_maxnreg = False  # a factory whose in-memory cache jqat cannot reach
  with pytest.raises(ValueError, match="maxnreg=128"):
    tc.triton_call(3, kernel=object(), out_shape="S", grid=(1,), maxnreg=128)
  assert not calls
  lib.get_or_create_triton_kernel._jqat_maxnreg = True
  tc.triton_call(3, kernel=object(), out_shape="S", grid=(1,), maxnreg=128, BLOCK=16)
  tc.triton_call(3, kernel=object(), out_shape="S", grid=(1,), BLOCK=16)
  assert calls[0][1][tc._MAXNREG] == 128 and calls[0][1]["BLOCK"] == 16 and tc._MAXNREG not in calls[1][1]
  tc.jax_triton.cache_clear()


@pytest.mark.parametrize("safe", [True, False])
def test_wrapper_keeps_tritons_cache_in_a_private_directory(monkeypatch, tmp_path, safe):
  """Triton's cache holds the launcher it loads as a shared library: with TRITON_CACHE_DIR unset it goes to
  ``$JQAT_CACHE_DIR/triton`` (mode 0o700), or to a fresh private directory when that one is unsafe."""
  _fake_jax_triton(monkeypatch)
  monkeypatch.setenv("TRITON_CACHE_DIR", "")  # not chosen by the user
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  if not safe:
    os.makedirs(tmp_path / "triton")
    os.chmod(tmp_path / "triton", 0o777)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tc.jax_triton()
  used = os.environ["TRITON_CACHE_DIR"]
  st = os.stat(used)
  assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
  if safe:
    assert used == str(tmp_path / "triton") and not caught
  else:
    shutil.rmtree(used)
    assert used != str(tmp_path / "triton")
    expected = f"jqat: not using the cache directory {tmp_path / 'triton'}: its group or other users can write to it"
    assert [str(w.message) for w in caught] == [expected + " (mode 777)"]
  tc.jax_triton.cache_clear()


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_user_set_triton_cache_dir_gets_the_same_check(monkeypatch, tmp_path, mode):
  """A TRITON_CACHE_DIR the user set was created and used whatever its permissions; one that others can write is
  now refused like jqat's own directories (one warning naming it), and a fresh private directory is used."""
  _fake_jax_triton(monkeypatch)
  chosen = tmp_path / "users_triton_cache"
  os.makedirs(chosen)
  os.chmod(chosen, mode)
  monkeypatch.setenv("TRITON_CACHE_DIR", str(chosen))
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path / "jqat"))
  with pytest.warns(RuntimeWarning, match=f"not using the cache directory {chosen}: its group or other users"):
    tc.jax_triton()
  used = os.environ["TRITON_CACHE_DIR"]
  assert used != str(chosen)
  st = os.stat(used)
  assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
  shutil.rmtree(used)
  tc.jax_triton.cache_clear()
  os.chmod(chosen, 0o700)  # a private one of the user's is kept
  monkeypatch.setenv("TRITON_CACHE_DIR", str(chosen))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tc.jax_triton()
  assert os.environ["TRITON_CACHE_DIR"] == str(chosen)
  tc.jax_triton.cache_clear()


_KW = {"num_warps": 4, "num_stages": 2, "num_ctas": 1, "compute_capability": None, "enable_fp_fusion": True,
       "metaparams": {"BLOCK": 64}, "dump": False}


def _fn(name):
  """A stand-in Triton JITFunction: what the factory and the cache key read of one."""
  return types.SimpleNamespace(name=name, cache_key=f"source hash of {name}", arg_names=["x", "n"])


def _get(lib, fn, scalar=7):
  return lib.get_or_create_triton_kernel(None, "cuda", fn, ["*bf16", "i32"], ((1, "i32", scalar),), **_KW)


def _genuine(name):
  return (name, 4, 1, 0, "ptx of " + name, "ttir", 90)


class _Process:
  """The fake jax-triton with jqat's cache directory under ``root``; ``restart()`` is what a new process sees:
  jax-triton's factory fresh (nothing in memory) and the disk cache installed again."""

  def __init__(self, monkeypatch, root):
    _, self.lib, self.compiled, _, _ = _fake_jax_triton(monkeypatch)
    monkeypatch.setenv("JQAT_CACHE_DIR", str(root))
    self.root, self.factory = root, self.lib.get_or_create_triton_kernel
    self.restart()

  def restart(self):
    self.lib.get_or_create_triton_kernel = self.factory
    tc._install_disk_cache()

  def files(self):
    """Every file under the cache root, whatever the entry format: {path: bytes}."""
    return {os.path.join(d, f): open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(self.root) for f in fs}


def test_disk_cache_serves_a_new_process(monkeypatch, tmp_path):
  p = _Process(monkeypatch, tmp_path / "jqat")
  kernel, attrs = _get(p.lib, _fn("a"))
  assert len(p.compiled) == 1 and kernel.ctor_args == _genuine("a")
  entries = list(p.files())
  assert [os.path.splitext(e)[1] for e in entries] == [".json"]
  assert stat.S_IMODE(os.stat(tmp_path / "jqat" / "kernels").st_mode) == 0o700
  # The same specialization with another scalar value: served from memory, no compile.
  _get(p.lib, _fn("a"), scalar=9)
  assert len(p.compiled) == 1
  p.restart()
  kernel2, attrs2 = _get(p.lib, _fn("a"))
  assert len(p.compiled) == 1, "the kernel was compiled again instead of read from disk"
  assert kernel2.ctor_args == kernel.ctor_args and attrs2 == attrs
  assert attrs2 == {(0,): [["tt.divisibility", 16]], (1,): []}
  # A different specialization (a scalar equal to 1 becomes a constant) compiles.
  _get(p.lib, _fn("a"), scalar=1)
  assert len(p.compiled) == 2


def test_disk_cache_leaves_unknown_internals_alone(monkeypatch):
  _, lib, _, _, _ = _fake_jax_triton(monkeypatch)
  lib.get_or_create_triton_kernel = lambda fn, compiled_kernel, args, dump=False: None  # another release's shape
  before = lib.get_or_create_triton_kernel
  tc._install_disk_cache()
  assert lib.get_or_create_triton_kernel is before


def _recompiles_and_repairs(p, name="a"):
  """A new process must compile ``name`` again, serve the genuine kernel, and leave an entry the next one loads."""
  p.restart()
  n = len(p.compiled)
  kernel, _ = _get(p.lib, _fn(name))
  assert len(p.compiled) == n + 1, "a bad entry was used instead of compiling"
  assert kernel.ctor_args == _genuine(name)
  p.restart()
  kernel, _ = _get(p.lib, _fn(name))
  assert len(p.compiled) == n + 1, "the bad entry was not replaced by the fresh compile"
  assert kernel.ctor_args == _genuine(name)


class _Payload:
  def __init__(self, target):
    self.target = target

  def __reduce__(self):  # unpickling this creates the directory ``target``
    return os.mkdir, (self.target,)


def test_disk_cache_never_unpickles(monkeypatch, tmp_path):
  p = _Process(monkeypatch, tmp_path / "jqat")
  _get(p.lib, _fn("a"))
  planted = str(tmp_path / "pwned")
  for path in p.files():
    with open(path, "wb") as f:
      f.write(pickle.dumps(_Payload(planted)))
  _recompiles_and_repairs(p)
  assert not os.path.exists(planted), "the cache executed a planted pickle"


def test_disk_cache_ignores_another_kernels_entry(monkeypatch, tmp_path):
  """An entry copied under another key (a poisoned cache) is not served for that key."""
  p = _Process(monkeypatch, tmp_path / "jqat")
  _get(p.lib, _fn("a"))
  (path_a,) = p.files()
  _get(p.lib, _fn("b"))
  (content_b,) = [c for path, c in p.files().items() if path != path_a]
  with open(path_a, "wb") as f:
    f.write(content_b)
  _recompiles_and_repairs(p, "a")


def _edit(field, value):
  def edit(entry):
    entry[field] = value
  return edit


_TAMPERED_JSON = {
    "PTX changed, hash kept": lambda e: e.update(ptx=e["ptx"] + "\n// planted"),
    "TTIR changed, hash kept": lambda e: e.update(ttir="planted"),
    "key material of another call": lambda e: e.update(key_material=e["key_material"].replace("of a", "of b")),
    "key of another call": _edit("key", "0" * 64),
    "format from the future": _edit("format", tc._ENTRY_FORMAT + 1),
    "format of the past": _edit("format", tc._ENTRY_FORMAT - 1),
    "negative scratch size": _edit("global_scratch_size", -128),
    "scratch size beyond 32 bits": _edit("global_scratch_size", 2**40),
    "scratch alignment 0": _edit("global_scratch_align", 0),
    "scratch alignment not a power of two": _edit("global_scratch_align", 96),
    "scratch alignment too large": _edit("global_scratch_align", 1 << 20),
    "string for an int": _edit("num_warps", "4"),
    "bool for an int": _edit("num_ctas", True),
    "negative shared memory": _edit("shared_mem_bytes", -1),
    "shared memory beyond 32 bits": _edit("shared_mem_bytes", 2**40),
    "other compute capability": _edit("compute_capability", 80),
    "float for an int": _edit("num_warps", 4.0),
    "null PTX": _edit("ptx", None),
    "attrs of one argument": lambda e: e.update(attrs=e["attrs"][:1]),
    "attrs with a string value": _edit("attrs", [[[0], [["tt.divisibility", "16"]]], [[1], []]]),
    "attrs index out of range": _edit("attrs", [[[0], []], [[5], []]]),
    "attrs index repeated": _edit("attrs", [[[0], []], [[0], []]]),
    "attrs as an object": _edit("attrs", {"0": []}),
    "unknown field": _edit("exec", "import os; os.system('true')"),
    "missing field": lambda e: e.pop("ttir_sha256"),
}

_TAMPERED_TEXT = {
    "not JSON": lambda text: b"{'format': 1" + text,
    "truncated": lambda text: text[: len(text) // 2],
    "not UTF-8": lambda text: b"\xff\xfe" + text,
    "a JSON list": lambda text: b"[" + text + b"]",
    "nested too deep to parse": lambda text: b"[" * 200_000 + b"]" * 200_000,
    "empty": lambda text: b"",
    "NaN for an int": lambda text: text.replace(b'"num_warps": 4', b'"num_warps": NaN'),
}


@pytest.mark.parametrize("tamper", list(_TAMPERED_JSON) + list(_TAMPERED_TEXT))
def test_disk_cache_ignores_a_tampered_entry(monkeypatch, tmp_path, tamper):
  p = _Process(monkeypatch, tmp_path / "jqat")
  _get(p.lib, _fn("a"))
  (path,) = [path for path in p.files() if path.endswith(".json")]
  with open(path, "rb") as f:
    text = f.read()
  if tamper in _TAMPERED_JSON:
    entry = json.loads(text)
    _TAMPERED_JSON[tamper](entry)
    text = json.dumps(entry).encode()
  else:
    text = _TAMPERED_TEXT[tamper](text)
  with open(path, "wb") as f:
    f.write(text)
  _recompiles_and_repairs(p)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_disk_cache_never_reads_a_non_regular_entry(monkeypatch, tmp_path, kind):
  """A FIFO planted under an entry's name blocked the reader forever (``open`` of a FIFO waits for a writer); it is
  now skipped unread, like a link or a directory, and the fresh compile replaces it with a regular entry."""
  p = _Process(monkeypatch, tmp_path / "jqat")
  _get(p.lib, _fn("a"))
  (path,) = p.files()
  os.unlink(path)
  if kind == "fifo":
    os.mkfifo(path, 0o600)
  elif kind == "symlink":
    decoy = tmp_path / "decoy.json"
    decoy.write_text("{}")
    os.symlink(decoy, path)
  else:
    os.mkdir(path)
  p.restart()
  done = []
  worker = threading.Thread(target=lambda: done.append(_get(p.lib, _fn("a"))), daemon=True)
  worker.start()
  worker.join(timeout=20)
  if worker.is_alive():  # release the blocked reader before failing
    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    worker.join(timeout=5)
    pytest.fail(f"reading the cache blocked on a {kind}")
  assert done and done[0][0].ctor_args == _genuine("a") and len(p.compiled) == 2
  if kind != "directory":  # os.replace cannot put a file over a directory: that entry stays uncached
    assert stat.S_ISREG(os.lstat(path).st_mode), "the fresh compile did not replace the planted entry"


@pytest.mark.parametrize("unsafe", ["world-writable", "group-writable", "another owner"])
def test_disk_cache_refuses_a_directory_others_can_write(monkeypatch, tmp_path, unsafe):
  p = _Process(monkeypatch, tmp_path / "jqat")
  _get(p.lib, _fn("a"))
  (entry,) = p.files()
  if unsafe == "another owner":
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
  else:
    os.chmod(os.path.dirname(entry), 0o777 if unsafe == "world-writable" else 0o770)
  before = p.files()
  with pytest.warns(RuntimeWarning, match="not using the cache directory"):
    p.restart()
  _get(p.lib, _fn("a"))
  assert len(p.compiled) == 2, "an entry was read from a directory that others can write"
  _get(p.lib, _fn("b"))
  assert p.files() == before, "an entry was written to a directory that others can write"


def _compile_concurrently(p, names):
  """Compiles ``names`` in one thread each; every compile waits inside jax-triton's factory until all are
  there, so each thread builds its kernel while the others are mid-compile."""
  barrier = threading.Barrier(len(names))
  p.lib.before_construct = lambda: barrier.wait(timeout=10)
  with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
    kernels = list(pool.map(lambda name: _get(p.lib, _fn(name))[0], names))
  p.lib.before_construct = lambda: None
  return kernels


def test_disk_cache_concurrent_compiles_keep_their_own_kernels(monkeypatch, tmp_path):
  p = _Process(monkeypatch, tmp_path / "jqat")
  names = ["a", "b", "c", "d"]
  kernels = _compile_concurrently(p, names)
  assert [k.ctor_args for k in kernels] == [_genuine(n) for n in names]
  assert p.lib.triton_kernel_call_lib.TritonKernel is _Kernel, "the kernel class was left replaced"
  p.restart()
  served = [_get(p.lib, _fn(n))[0].ctor_args for n in names]
  assert len(p.compiled) == len(names), "entries written by concurrent compiles were not served"
  assert served == [_genuine(n) for n in names], "a disk entry holds another thread's kernel"


def test_disk_cache_concurrent_writers_of_one_key_use_their_own_temp_files(monkeypatch, tmp_path):
  p = _Process(monkeypatch, tmp_path / "jqat")
  renamed = []
  replace = os.replace

  def recording_replace(src, dst):
    renamed.append(os.fspath(src))
    replace(src, dst)

  monkeypatch.setattr(os, "replace", recording_replace)
  _compile_concurrently(p, ["a"] * 4)
  assert len(renamed) == 4 and len(set(renamed)) == 4, f"temporary files shared between threads: {renamed}"
  assert [os.path.splitext(f)[1] for f in p.files()] == [".json"], "a temporary file was left behind"
  p.restart()
  assert _get(p.lib, _fn("a"))[0].ctor_args == _genuine("a") and len(p.compiled) == 4


def _real_triton_lib(monkeypatch):
  """jax-triton 0.3.1's ``triton_lib`` loaded from its installed source with a stand-in for jaxlib's GPU module
  (absent from CPU jaxlib); returns (the module, the stand-in's TritonKernel constructions)."""
  import importlib.util

  spec = importlib.util.find_spec("jax_triton")
  if spec is None or not spec.submodule_search_locations:
    pytest.skip("jax-triton is not installed")
  source = os.path.join(spec.submodule_search_locations[0], "triton_lib.py")
  from jax._src import lib as jaxlib_lib

  made = []
  kernel_lib = types.SimpleNamespace(TritonKernel=lambda *args: made.append(args) or _Kernel(*args),
                                     get_compute_capability=lambda device: 90)
  monkeypatch.setattr(jaxlib_lib, "gpu_triton", kernel_lib, raising=False)
  package = types.ModuleType("jax_triton")
  package.__path__, package.__version__ = [], "0.3.1"
  monkeypatch.setitem(sys.modules, "jax_triton", package)
  module_spec = importlib.util.spec_from_file_location("jax_triton.triton_lib", source)
  lib = importlib.util.module_from_spec(module_spec)
  monkeypatch.setitem(sys.modules, "jax_triton.triton_lib", lib)
  module_spec.loader.exec_module(lib)
  return lib, made


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_disk_cache_with_jax_triton_031s_factory(monkeypatch, tmp_path):
  """The real factory compiles a Triton kernel to PTX (no GPU needed); its constructor values and
  specialization attributes go through the JSON entry unchanged, and a new process compiles nothing."""
  import triton
  import triton.language as tl
  from triton.backends.compiler import GPUTarget
  from triton.backends.nvidia.compiler import CUDABackend

  lib, made = _real_triton_lib(monkeypatch)
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))

  @triton.jit
  def add(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) + tl.load(y_ptr + i, mask=i < n), mask=i < n)

  args = (lambda device, cc: CUDABackend(GPUTarget("cuda", cc, 32)), "cuda", add, ["*fp32", "*fp32", "i32", "*fp32"],
          ((2, "i32", 1000),))
  kw = {**_KW, "compute_capability": 90, "metaparams": {"BLOCK": 128}}
  factory = lib.get_or_create_triton_kernel
  tc._install_disk_cache()
  assert lib.get_or_create_triton_kernel is not factory, "the cache did not recognise jax-triton 0.3.1"
  kernel, attrs = lib.get_or_create_triton_kernel(*args, **kw)
  assert len(made) == 1 and ".entry add" in kernel.ctor_args[4]  # PTX text
  assert attrs == {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [],
                   (3,): [["tt.divisibility", 16]]}
  lib._COMPILED_KERNEL_CACHE.clear()  # a new process
  lib.get_or_create_triton_kernel = factory
  tc._install_disk_cache()
  kernel2, attrs2 = lib.get_or_create_triton_kernel(*args, **kw)
  assert not lib._COMPILED_KERNEL_CACHE, "jax-triton compiled the kernel again"
  assert kernel2.ctor_args == kernel.ctor_args and attrs2 == attrs


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_gluon_kernel_through_jax_triton_031s_factory(monkeypatch, tmp_path):
  """A Gluon kernel, which jax-triton 0.3.1's own compile cannot take (it builds a Triton ASTSource), is compiled by
  jqat's wrapper with the same specialization and becomes the same kind of TritonKernel (PTX, jaxlib launches it as
  any custom call); jax-triton's in-memory cache never sees it, and a new process reads it from disk."""
  from triton.backends.compiler import GPUTarget
  from triton.backends.nvidia.compiler import CUDABackend
  from triton.experimental import gluon
  from triton.experimental.gluon import language as gl

  lib, made = _real_triton_lib(monkeypatch)
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))

  @gluon.jit
  def twice(x_ptr, n, out_ptr, BLOCK: gl.constexpr):
    i = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out_ptr + i, gl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)

  args = (lambda device, cc: CUDABackend(GPUTarget("cuda", cc, 32)), "cuda", twice, ["*fp32", "i32", "*fp32"],
          ((1, "i32", 1000),))
  kw = {**_KW, "compute_capability": 90, "metaparams": {"BLOCK": 128}}
  factory = lib.get_or_create_triton_kernel
  tc._install_disk_cache()
  kernel, attrs = lib.get_or_create_triton_kernel(*args, **kw)
  name, num_warps, num_ctas, _, ptx, _, cc = kernel.ctor_args
  assert (name, num_warps, num_ctas, cc) == ("twice", 4, 1, 90) and ".entry twice" in ptx
  assert attrs == {(0,): [["tt.divisibility", 16]], (1,): [], (2,): [["tt.divisibility", 16]]}
  assert not lib._COMPILED_KERNEL_CACHE, "jax-triton's own compile ran on a Gluon kernel"
  lib.get_or_create_triton_kernel = factory  # a new process
  tc._install_disk_cache()
  kernel2, attrs2 = lib.get_or_create_triton_kernel(*args, **kw)
  assert len(made) == 2 and kernel2.ctor_args == kernel.ctor_args and attrs2 == attrs


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_register_cap_through_jax_triton_031s_factory(monkeypatch, tmp_path):
  """A launch's register cap (``maxnreg``), which jax-triton 0.3.1 cannot pass to Triton, reaches the PTX
  (``.maxnreg``) through jqat's wrapper of its factory; the capped kernel is keyed apart from the uncapped one, in
  memory and on disk, and never enters jax-triton's own in-memory cache, whose key has no room for the cap (the
  uncapped kernel compiled first, or after, stays uncapped)."""
  import triton
  import triton.language as tl
  from triton.backends.compiler import GPUTarget
  from triton.backends.nvidia.compiler import CUDABackend

  lib, made = _real_triton_lib(monkeypatch)
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))

  @triton.jit
  def scale_rows(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 3.0, mask=i < n)

  args = (lambda device, cc: CUDABackend(GPUTarget("cuda", cc, 32)), "cuda", scale_rows, ["*fp32", "i32", "*fp32"],
          ((1, "i32", 1000),))
  kw = {**_KW, "compute_capability": 90, "metaparams": {"BLOCK": 128}}
  capped_kw = {**kw, "metaparams": {"BLOCK": 128, tc._MAXNREG: 40}}
  factory = lib.get_or_create_triton_kernel
  tc._install_disk_cache()
  assert lib.get_or_create_triton_kernel._jqat_maxnreg
  plain, _ = lib.get_or_create_triton_kernel(*args, **kw)
  capped, _ = lib.get_or_create_triton_kernel(*args, **capped_kw)
  assert ".maxnreg" not in plain.ctor_args[4] and ".maxnreg 40" in capped.ctor_args[4]
  assert len(made) == 2 and len(lib._COMPILED_KERNEL_CACHE) == 1, "the capped kernel entered jax-triton's cache"
  assert lib.get_or_create_triton_kernel(*args, **kw)[0] is plain
  assert lib.get_or_create_triton_kernel(*args, **capped_kw)[0] is capped
  lib._COMPILED_KERNEL_CACHE.clear()  # a new process: both from disk, nothing compiled
  lib.get_or_create_triton_kernel = factory
  tc._install_disk_cache()
  capped2, _ = lib.get_or_create_triton_kernel(*args, **capped_kw)
  plain2, _ = lib.get_or_create_triton_kernel(*args, **kw)
  assert len(made) == 4 and not lib._COMPILED_KERNEL_CACHE
  assert capped2.ctor_args == capped.ctor_args and plain2.ctor_args == plain.ctor_args


@pytest.mark.fresh_process  # a real compile: not in a process where the interpreter has run
def test_kernels_with_global_scratch_get_its_size(monkeypatch, tmp_path):
  """A kernel that makes a tensor descriptor (TMA) needs Triton's global scratch, 128 bytes per descriptor and
  program, which jax-triton 0.3.1 does not pass on: jaxlib's TritonKernel gets the size and alignment from
  Triton's metadata after jax-triton's seven values, from the compile and from the disk cache; a jaxlib whose
  TritonKernel takes only the seven gives an error that says so. Kernels without scratch get the seven alone."""
  import triton
  import triton.language as tl
  from triton.backends.compiler import GPUTarget
  from triton.backends.nvidia.compiler import CUDABackend

  lib, made = _real_triton_lib(monkeypatch)
  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  kept = []  # jaxlib takes the scratch from the default pool: its memory is kept mapped (jqat.ffi.scratch_pool)
  monkeypatch.setattr(tc.scratch_pool, "keep_mapped", lambda: kept.append(len(made)))

  @triton.jit
  def copy_rows(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    desc = tl.make_tensor_descriptor(x_ptr, shape=[n, 16], strides=[16, 1], block_shape=[BLOCK, 16])
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + rows[:, None] * 16 + tl.arange(0, 16)[None, :], desc.load([tl.program_id(0) * BLOCK, 0]),
             mask=rows[:, None] < n)

  args = (lambda device, cc: CUDABackend(GPUTarget("cuda", cc, 32)), "cuda", copy_rows, ["*fp32", "i32", "*fp32"],
          ((1, "i32", 1000),))
  kw = {**_KW, "compute_capability": 90, "metaparams": {"BLOCK": 64}}
  factory = lib.get_or_create_triton_kernel
  tc._install_disk_cache()
  kernel, _ = lib.get_or_create_triton_kernel(*args, **kw)
  assert len(made) == 1 and len(kernel.ctor_args) == 9 and ".entry copy_rows" in kernel.ctor_args[4]
  assert kernel.ctor_args[7:] == (128, 128), kernel.ctor_args[7:]  # one descriptor: 128 bytes, 128-byte aligned
  lib._COMPILED_KERNEL_CACHE.clear()  # a new process: served from disk with the same values
  lib.get_or_create_triton_kernel = factory
  tc._install_disk_cache()
  kernel2, _ = lib.get_or_create_triton_kernel(*args, **kw)
  assert not lib._COMPILED_KERNEL_CACHE and kernel2.ctor_args == kernel.ctor_args
  assert kept == [1, 2]  # after each kernel with scratch was built
  # An older jaxlib: its TritonKernel rejects the two values.
  lib._COMPILED_KERNEL_CACHE.clear()
  lib.get_or_create_triton_kernel = factory
  tc._install_disk_cache()

  def seven_only(name, num_warps, num_ctas, shared, ptx, ttir, cc):
    return _Kernel(name, num_warps, num_ctas, shared, ptx, ttir, cc)

  monkeypatch.setattr(lib.triton_kernel_call_lib, "TritonKernel", seven_only)
  with pytest.raises(RuntimeError, match="needs 128 bytes of global scratch per program"):
    lib.get_or_create_triton_kernel(*args, **kw)
  assert kept == [1, 2]




# JAX's persistent compilation cache (jqat.enable_compilation_cache), in child processes: JAX opens its cache
# once per process, so enabling it here would send every later test's programs to disk.
_XLA_CACHE_CHILD = r"""
import jax, jax.numpy as jnp, jqat
events = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event.rsplit("/", 1)[-1]))
path = jqat.enable_compilation_cache()
jax.block_until_ready(jax.jit(lambda x: x * 2 + 1)(jnp.arange(3.0)))  # tiny: compiled in far under 1 s
print("RESULT", path, events.count("cache_misses"), events.count("cache_hits"))
"""


def _xla_cache_child(root):
  import subprocess

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "JQAT_CACHE_DIR": str(root), "PYTHONPATH": repo, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", _XLA_CACHE_CHILD], env=env, capture_output=True, text=True,
                       check=True).stdout
  _, path, misses, hits = out.splitlines()[-1].split()
  return path, int(misses), int(hits)


def test_compilation_cache_serves_a_new_process(tmp_path):
  path, misses, hits = _xla_cache_child(tmp_path)
  assert path == str(tmp_path / "xla") and misses >= 1 and hits == 0
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
  assert os.listdir(path), "a small, quickly compiled program was not written to the cache"
  assert _xla_cache_child(tmp_path) == (path, 0, misses), "the new process compiled instead of reading the cache"


@pytest.mark.parametrize("explicit", [False, True])
def test_compilation_cache_refuses_a_directory_others_can_write(monkeypatch, tmp_path, explicit):
  import jax

  import jqat

  monkeypatch.setenv("JQAT_CACHE_DIR", str(tmp_path))
  os.makedirs(tmp_path / "xla")
  os.chmod(tmp_path / "xla", 0o777)
  before = jax.config.jax_compilation_cache_dir
  with pytest.warns(RuntimeWarning, match="group or other users can write"):
    assert jqat.enable_compilation_cache(tmp_path / "xla" if explicit else None) is None
  assert jax.config.jax_compilation_cache_dir == before


def test_compilation_cache_rejects_a_path_that_is_not_one():
  import jqat

  with pytest.raises(TypeError, match="path must be a str, an os.PathLike or None; got int"):
    jqat.enable_compilation_cache(3)


_GPU_CHILD = r"""
import sys, numpy as np, jax, jax.numpy as jnp, jqat
q = jax.random.normal(jax.random.key(0), (1, 200, 4, 64), jnp.bfloat16)
loss = lambda q: jnp.sum(jqat.attention(q, q, q, is_causal=True, implementation="triton").astype(jnp.float32) ** 2)
grad = jax.jit(jax.grad(loss))(q)
np.save(sys.argv[1], np.asarray(grad, np.float32))
lib = sys.modules["jax_triton.triton_lib"]
print("RESULT", getattr(lib.get_or_create_triton_kernel, "_jqat_disk_cache", False), len(lib._COMPILED_KERNEL_CACHE))
"""


@pytest.mark.gpu
def test_disk_cache_serves_a_new_gpu_process(tmp_path):
  """The installed jax-triton: a second process builds every kernel of an attention gradient from the JSON
  entries the first wrote, compiling none, and computes the same gradient."""
  import subprocess

  from conftest import assert_reordered_equal

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
  path = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))  # keep where jax-triton lives
  env.update(JQAT_CACHE_DIR=str(tmp_path), PYTHONPATH=path, TRITON_INTERPRET="0")

  def child(name):
    out = subprocess.run([sys.executable, "-c", _GPU_CHILD, str(tmp_path / name)], env=env, capture_output=True,
                         text=True, check=True).stdout
    _, installed, compiled = out.splitlines()[-1].split()
    return installed == "True", int(compiled), np.load(tmp_path / f"{name}.npy")

  installed, compiled, grad = child("cold")
  assert installed, "the disk cache did not recognise the installed jax-triton"
  entries = os.listdir(tmp_path / "kernels")
  assert compiled > 0 and entries and all(e.endswith(".json") for e in entries), entries
  _, compiled_warm, grad_warm = child("warm")
  assert compiled_warm == 0, f"{compiled_warm} kernels were compiled again"
  assert_reordered_equal(grad_warm, grad, name="gradient from cached kernels")
