"""Loads FastVideo's Attn-QAT training kernels from the ``fastvideo-kernel`` sdist at benchmark time.

The kernels are never copied into this repository: ``load`` checks the sdist's sha256, extracts only the three
Triton modules the training attention needs into a directory of the caller's, as package
``fastvideo_kernel.triton_kernels``, and imports ``attn_qat_train`` from there.

  with tempfile.TemporaryDirectory() as d:
    attn_qat_train = fastvideo.load(".device/fastvideo_kernel-0.3.5.tar.gz", d)
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import os
import posixpath
import sys
import tarfile

PINNED_SHA256 = "f2c865cde78d6b218ca4f8695cad96464d79d73f144f142f51bba0920976dcb4"  # fastvideo_kernel-0.3.5.tar.gz
DEFAULT_GLOB = ".device/fastvideo_kernel-*.tar.gz"
PACKAGE_DIR = "python/fastvideo_kernel/triton_kernels"  # inside the sdist's top-level folder
MODULES = ("attn_qat_train.py", "quant_utils.py", "nvfp4_utils.py")


def default_sdist() -> str | None:
  """The newest-named sdist matching ``DEFAULT_GLOB`` (relative to the working directory), or None."""
  found = sorted(glob.glob(DEFAULT_GLOB))
  return found[-1] if found else None


def sha256_of(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _unsafe_name(name: str) -> bool:
  return name.startswith("/") or posixpath.isabs(name) or ".." in name.replace("\\", "/").split("/")


def _member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
  """tarfile extraction filter: only regular files with relative names free of ``..`` (a second line of defence;
  ``extract`` already refuses such archives before writing anything)."""
  if _unsafe_name(member.name) or not member.isreg():
    raise ValueError(
      f"fastvideo sdist: refusing member {member.name!r} (expected a regular file with a relative path without '..')"
    )
  return member


def extract(sdist: str, dest: str, sha256: str = PINNED_SHA256) -> str:
  """Checks ``sdist``'s sha256 against ``sha256``, then writes the three kernel modules to
  ``dest/fastvideo_kernel/triton_kernels/`` (plus empty ``__init__.py`` files). Returns ``dest``.

  Refuses, before writing anything, an archive whose hash differs, any member with an absolute path or a ``..``
  component, and one lacking any of the three modules.
  """
  got = sha256_of(sdist)
  if got != sha256.lower():
    raise ValueError(
      f"fastvideo sdist {sdist!r}: expected sha256 {sha256}, got {got} (pass --fastvideo-sha256 to "
      "accept another release)"
    )
  with tarfile.open(sdist, "r:gz") as tar:
    members = tar.getmembers()
    bad = [m.name for m in members if _unsafe_name(m.name)]
    if bad:
      raise ValueError(f"fastvideo sdist {sdist!r}: members with absolute paths or '..': {bad[:5]}")
    wanted = {}
    for m in members:
      parts = m.name.split("/")
      if len(parts) >= 2 and "/".join(parts[1:-1]) == PACKAGE_DIR and parts[-1] in MODULES:
        wanted[parts[-1]] = m
    missing = sorted(set(MODULES) - set(wanted))
    if missing:
      raise ValueError(
        f"fastvideo sdist {sdist!r}: expected <top>/{PACKAGE_DIR}/{{{','.join(MODULES)}}}, missing {missing}"
      )
    pkg = os.path.join(dest, "fastvideo_kernel", "triton_kernels")
    os.makedirs(pkg, exist_ok=True)
    for init in (os.path.join(dest, "fastvideo_kernel", "__init__.py"), os.path.join(pkg, "__init__.py")):
      open(init, "w").close()  # empty: the real __init__ files import the CUDA extension, which we do not build
    for name, m in wanted.items():
      # Rename on the way out so the file lands flat in pkg whatever folder the sdist used.
      m = _member_filter(m, dest).replace(name=name)
      tar.extract(m, pkg, filter=_member_filter)
  return dest


def load(sdist: str, dest: str, sha256: str = PINNED_SHA256):
  """``extract`` then import; returns the module ``fastvideo_kernel.triton_kernels.attn_qat_train``. ``dest``
  goes on ``sys.path`` and must outlive the use of the kernels (Triton reads their source to compile)."""
  for mod in [m for m in sys.modules if m == "fastvideo_kernel" or m.startswith("fastvideo_kernel.")]:
    del sys.modules[mod]  # a second load (another dest) must not return the first one's modules
  extract(sdist, dest, sha256)
  sys.path.insert(0, dest)
  importlib.invalidate_caches()
  return importlib.import_module("fastvideo_kernel.triton_kernels.attn_qat_train")
