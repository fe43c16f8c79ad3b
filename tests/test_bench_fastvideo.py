"""benchmarks/fastvideo.py (the FastVideo sdist loader) and the CPU-checkable parts of benchmarks/attention.py."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile

import pytest
from conftest import BENCH, load_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


fastvideo = load_bench("fastvideo")

TOP = "fastvideo_kernel-9.9.9"
PKG = f"{TOP}/python/fastvideo_kernel/triton_kernels"
# Relative imports between the three modules, as in the real ones, so importing proves the package layout.
GOOD = {
  f"{PKG}/attn_qat_train.py": b"from .quant_utils import X\n\ndef attention(*args):\n  return X\n",
  f"{PKG}/quant_utils.py": b"from .nvfp4_utils import Y\nX = Y + 1\n",
  f"{PKG}/nvfp4_utils.py": b"Y = 41\n",
  # Must not be extracted: the real package __init__ loads a CUDA extension; the rest is unused.
  f"{TOP}/python/fastvideo_kernel/__init__.py": b"raise ImportError('the CUDA extension')\n",
  f"{PKG}/__init__.py": b"raise ImportError('the CUDA extension')\n",
  f"{PKG}/fused_attention.py": b"raise RuntimeError('not wanted')\n",
  f"{TOP}/setup.py": b"raise RuntimeError('not wanted')\n",
  f"{TOP}/attn_qat_train.py": b"raise RuntimeError('wrong folder')\n",
}


def _sdist(tmp_path, files, links=()):
  """A .tar.gz holding ``files`` (name -> bytes) and symlinks ``links`` (name, target); returns (path, sha256)."""
  path = tmp_path / "fastvideo_kernel-9.9.9.tar.gz"
  with tarfile.open(path, "w:gz") as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
    for name, target in links:
      info = tarfile.TarInfo(name)
      info.type, info.linkname = tarfile.SYMTYPE, target
      tar.addfile(info)
  return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def _restore_imports():
  path = list(sys.path)
  yield
  sys.path[:] = path
  for mod in [m for m in sys.modules if m == "fastvideo_kernel" or m.startswith("fastvideo_kernel.")]:
    del sys.modules[mod]


def _tree(root):
  return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_extracts_only_the_three_modules_and_imports(tmp_path):
  sdist, sha = _sdist(tmp_path, GOOD)
  dest = tmp_path / "out"
  mod = fastvideo.load(sdist, str(dest), sha)
  assert mod.attention() == 42
  assert mod.__name__ == "fastvideo_kernel.triton_kernels.attn_qat_train"
  assert os.path.dirname(mod.__file__) == str(dest / "fastvideo_kernel" / "triton_kernels")
  got = [p for p in _tree(dest) if "__pycache__" not in p]
  pkg = os.path.join("fastvideo_kernel", "triton_kernels")
  assert got == sorted(
    [os.path.join("fastvideo_kernel", "__init__.py")]
    + [os.path.join(pkg, f) for f in ("__init__.py", "attn_qat_train.py", "nvfp4_utils.py", "quant_utils.py")]
  )
  assert (dest / pkg / "__init__.py").read_bytes() == b""  # ours, not the sdist's


def test_wrong_hash_refused_before_writing(tmp_path):
  sdist, sha = _sdist(tmp_path, GOOD)
  dest = tmp_path / "out"
  dest.mkdir()
  with pytest.raises(ValueError, match=f"expected sha256 {fastvideo.PINNED_SHA256}, got {sha}"):
    fastvideo.load(sdist, str(dest))  # the pinned hash of the real 0.3.5
  with pytest.raises(ValueError, match="sha256"):
    fastvideo.extract(sdist, str(dest), "0" * 64)
  assert _tree(dest) == []


@pytest.mark.parametrize("bad", [f"{TOP}/../evil.py", "../evil.py", "/tmp/jqat_fastvideo_evil.py", f"{PKG}/a/../../x"])
def test_unsafe_member_names_refused_before_writing(tmp_path, bad):
  sdist, sha = _sdist(tmp_path, {**GOOD, bad: b"evil\n"})
  with tarfile.open(sdist) as tar:
    assert bad in tar.getnames()  # the archive really holds the name under test
  dest = tmp_path / "a" / "out"
  dest.mkdir(parents=True)
  with pytest.raises(ValueError, match="absolute paths or '..'"):
    fastvideo.extract(sdist, str(dest), sha)
  assert _tree(dest) == []
  assert not os.path.exists("/tmp/jqat_fastvideo_evil.py") and not (tmp_path / "a" / "evil.py").exists()


def test_symlink_module_refused(tmp_path):
  files = {k: v for k, v in GOOD.items() if not k.endswith("/nvfp4_utils.py")}
  sdist, sha = _sdist(tmp_path, files, links=[(f"{PKG}/nvfp4_utils.py", "/etc/passwd")])
  with pytest.raises(ValueError, match="expected a regular file"):
    fastvideo.extract(sdist, str(tmp_path / "out"), sha)


def test_missing_module_refused(tmp_path):
  files = {k: v for k, v in GOOD.items() if not k.endswith("/quant_utils.py")}
  sdist, sha = _sdist(tmp_path, files)
  with pytest.raises(ValueError, match=r"missing \['quant_utils.py'\]"):
    fastvideo.extract(sdist, str(tmp_path / "out"), sha)


def test_real_sdist_loads(tmp_path):
  sdist = os.path.join(ROOT, ".device", "fastvideo_kernel-0.3.5.tar.gz")
  if not os.path.exists(sdist):
    pytest.skip(f"{sdist} absent")
  pytest.importorskip("torch")
  pytest.importorskip("triton")
  mod = fastvideo.load(sdist, str(tmp_path))
  assert callable(mod.attention)
  kernels = os.path.join("fastvideo_kernel", "triton_kernels")
  assert [p for p in _tree(tmp_path) if p.endswith(".py") and "__init__" not in p] == sorted(
    os.path.join(kernels, f) for f in fastvideo.MODULES
  )


def test_attention_help_runs():
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  out = subprocess.run(
    [sys.executable, os.path.join(BENCH, "attention.py"), "--help"],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr
  for flag in ("--shapes", "--rows", "--memory", "--fastvideo-sdist", "--fastvideo-sha256", "--fastvideo-shapes"):
    assert flag in out.stdout


def test_attention_shapes_and_fastvideo_failures_are_reasons(tmp_path):
  bench = load_bench("attention")
  assert bench.FULL[:2] == [(1, 16, 16, 4096, 128, False), (1, 16, 16, 4096, 128, True)]
  assert len(bench.FULL) == 9 and bench.FULL[8][4] == 96 and set(bench.QUICK) <= set(bench.FULL)  # 8 + D = 96
  assert any(s[3] == 16384 for s in bench.QUICK)
  assert bench._parse_indices("all", 3) == {0, 1, 2} and bench._parse_indices("none", 3) == set()
  assert bench._parse_indices("0,2", 3) == {0, 2}
  with pytest.raises(SystemExit, match="--fastvideo-shapes"):
    bench._parse_indices("3", 3)
  with pytest.raises(SystemExit, match="--rows"):
    bench._parse_indices("1,x", 3, "--rows")
  # A wrong hash, a missing file or absent torch is a "-" with its reason, never an exception.
  sdist, _ = _sdist(tmp_path, GOOD)
  args = type("Args", (), dict(fastvideo_sdist=sdist, fastvideo_sha256=None))
  assert "expected sha256" in bench._fastvideo_status(args, str(tmp_path / "w"), True)
  args.fastvideo_sdist = str(tmp_path / "absent.tar.gz")
  assert "FileNotFoundError" in bench._fastvideo_status(args, str(tmp_path / "w"), True)
  assert bench._fastvideo_status(args, str(tmp_path / "w"), "torch sees no CUDA GPU") == "torch sees no CUDA GPU"


def test_attention_plot_with_missing_columns(tmp_path):
  pytest.importorskip("matplotlib")
  bench = load_bench("attention")
  rows = [
    dict(B=1, N=16, K=16, S=4096, D=128, causal=False, jqat_fwdbwd_ms=2.3, cudnn_fwdbwd_ms=0.9, sdpa_fwdbwd_ms=1.0),
    dict(B=1, N=32, K=8, S=8192, D=128, causal=True, jqat_fwdbwd_ms=10.1, fastvideo_error="no GQA"),
  ]
  path = tmp_path / "a.png"
  bench._plot(rows, str(path))
  assert path.stat().st_size > 1000
