"""Framework-free Triton kernels (no JAX, no torch) and the device functions they share."""
