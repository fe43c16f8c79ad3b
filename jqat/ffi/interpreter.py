"""Triton's interpreter (``TRITON_INTERPRET=1``) made to run jqat's kernels under NumPy >= 2.4.

Triton 3.6's interpreter holds every scalar, program ids included, as a 1-element array and turns a loop bound
into a Python int with ``int(array)``, which NumPy 2.4 refuses for arrays that are not 0-dimensional. Every
executor that runs a plan in the interpreter (``callback_launch``, ``torch_launch``) installs this once.
"""

from __future__ import annotations

import functools


@functools.cache
def install() -> None:
  """Makes the interpreter's tensors index with their single element (a no-op once installed)."""
  from triton.runtime import interpreter  # noqa: PLC0415

  patch = interpreter._patch_lang_tensor

  def patch_lang_tensor(tensor, scope):
    patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

  interpreter._patch_lang_tensor = patch_lang_tensor
