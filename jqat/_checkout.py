"""Source checkouts import ``jqat.ffi`` and ``jqat.kernels_triton`` from the top-level folders.

The three layers live in three folders (``kernels_triton/`` <- ``ffi/`` <- ``jqat/``); an installed
wheel puts the first two inside the package (``pyproject.toml``'s ``package-dir``) so that ``jqat``
is its only top-level name. When ``jqat`` is imported straight from a checkout (``PYTHONPATH`` at the
repository root), this finder maps exactly those two names to their folders; nothing else is exposed.
"""

import importlib.abc
import importlib.util
import os
import sys

_LAYERS = ("ffi", "kernels_triton")


class _CheckoutLayers(importlib.abc.MetaPathFinder):
  def __init__(self, root):
    self._folders = {f"jqat.{name}": os.path.join(root, name) for name in _LAYERS}

  def find_spec(self, fullname, path=None, target=None):
    folder = self._folders.get(fullname)
    if folder is None:
      return None
    return importlib.util.spec_from_file_location(
      fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


def install():
  """Adds the finder when ``jqat`` sits in a checkout whose layers are not inside the package."""
  package = os.path.dirname(os.path.abspath(__file__))
  root = os.path.dirname(package)
  inside = all(os.path.isdir(os.path.join(package, name)) for name in _LAYERS)
  beside = all(os.path.isfile(os.path.join(root, name, "__init__.py")) for name in _LAYERS)
  if inside or not beside or any(isinstance(f, _CheckoutLayers) for f in sys.meta_path):
    return
  sys.meta_path.append(_CheckoutLayers(root))
