"""The wheel: one top-level package, ``jqat``, with the kernel and custom-call layers inside it."""

import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _build_wheel(out: pathlib.Path) -> pathlib.Path:
  pytest.importorskip("setuptools")
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                  str(ROOT)], check=True, capture_output=True, text=True)
  (wheel,) = out.glob("jqat-*.whl")
  return wheel


def test_wheel_has_one_top_level_package(tmp_path):
  wheel = _build_wheel(tmp_path)
  with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
  packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
  assert packages == {"jqat"}, sorted(packages)
  for module in ("jqat/ffi/plan.py", "jqat/ffi/jax_launch.py", "jqat/kernels_triton/attention_fwd.py",
                 "jqat/kernels_triton/nvfp4.py", "jqat/_src/attention.py", "jqat/torch/_attention.py"):
    assert module in names, module
  assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) or "/tests/" in n for n in names)
  # Every module of the package's folders is in the wheel.
  for src in (ROOT / "jqat").rglob("*.py"):
    assert src.relative_to(ROOT).as_posix() in names, src


def test_installed_wheel_imports_without_the_checkout(tmp_path):
  """Installed into an empty directory and imported with the checkout off the path: the layers are found inside."""
  wheel = _build_wheel(tmp_path / "dist")
  site = tmp_path / "site"
  with zipfile.ZipFile(wheel) as z:
    z.extractall(site)
  code = ("import sys, jqat, jqat.ffi.plan, jqat.kernels_triton.nvfp4 as k\n"
          f"assert all({str(ROOT)!r} not in (m.__file__ or '') for m in (jqat, jqat.ffi.plan, k)), jqat.__file__\n"
          "assert 'ffi' not in sys.modules and 'kernels_triton' not in sys.modules\n"
          "print(jqat.ffi.plan.__file__)")
  env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().startswith(str(site)), result.stdout


def test_kernel_layers_import_without_jax_or_torch():
  """The layers (README, "Layout"): kernels_triton imports no JAX or torch; the launch plans are framework-free.
  ``import jqat`` is lazy."""
  pytest.importorskip("triton")
  code = ("import sys, jqat.kernels_triton.attention_fwd, jqat.kernels_triton.attention_bwd, "
          "jqat.kernels_triton.nvfp4, jqat.kernels_triton.rope_qdq, jqat.ffi.plan\n"
          "bad = sorted(m for m in ('jax', 'torch', 'flax') if m in sys.modules)\n"
          "assert not bad, bad\n"
          "import jqat\n"
          "assert callable(jqat.attention) and jqat.QATConfig().quantize_p and callable(jqat.nvfp4.fake_quantize)\n"
          "assert set(jqat.__all__) <= set(dir(jqat))")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                          "JAX_PLATFORMS": "cpu", "TRITON_INTERPRET": "1"}, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
