"""Keeps the CUDA memory of Triton's global scratch mapped from one launch to the next.

A kernel that makes tensor descriptors (the forward's TMA copies) needs global scratch: 256 bytes per
program. Both JAX launchers take it per launch with ``cuMemAllocAsync`` (jaxlib's ``TritonKernel`` on the
jax-triton path, ``jqat.ffi.callback_launch`` on the other), from the device's current stream-ordered
memory pool (by default its default pool), and free it behind the launch. That pool's release threshold is
0 by default, so at every synchronization the driver unmaps what is free, and the next launch maps it
again. Measured on the H200: 0.02-0.03 ms per jitted forward in a loop of 10 calls and a sync, gone with
the threshold raised (docs/PERFORMANCE.md, section 7).

So the first time a launcher builds or runs a kernel with scratch, :func:`keep_mapped` raises the release
threshold of every device's current pool to :data:`KEEP_BYTES`. It never lowers one (a caller's higher
threshold stays; PyTorch's ``cudaMallocAsync`` backend sets the maximum), and the threshold maps nothing
by itself: the pool only holds on to up to that much of what it already handed out.
"""

from __future__ import annotations

import ctypes
import threading

# Twice the 32 MiB the default pool was seen to map at once for a few hundred kilobytes of scratch; the
# scratch of the largest launch measured (75k tokens, 40 heads) is about 6 MB.
KEEP_BYTES = 64 << 20
_RELEASE_THRESHOLD = 4  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD

_lock = threading.Lock()
_done = False


def keep_mapped(lib=None) -> None:
  """Raises each device's current memory pool's release threshold to at least :data:`KEEP_BYTES` (once per
  process).

  ``lib``: the CUDA driver library (default: ``libcuda.so.1``). Does nothing without a driver or before it is
  initialized, and skips a device whose pool it cannot query: the threshold only saves time."""
  global _done
  with _lock:
    if _done:
      return
    if lib is None:
      try:
        lib = ctypes.CDLL("libcuda.so.1")
      except OSError:
        return
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
      return
    for ordinal in range(count.value):
      device, pool, held = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
      if (lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0
          or lib.cuDeviceGetMemPool(ctypes.byref(pool), device) != 0
          or lib.cuMemPoolGetAttribute(pool, _RELEASE_THRESHOLD, ctypes.byref(held)) != 0):
        continue
      if held.value < KEEP_BYTES:
        lib.cuMemPoolSetAttribute(pool, _RELEASE_THRESHOLD, ctypes.byref(ctypes.c_uint64(KEEP_BYTES)))
    _done = True
