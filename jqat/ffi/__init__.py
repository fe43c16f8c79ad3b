"""The XLA custom-call layer: JAX primitives that launch the Triton kernels of ``kernels_triton``.

Nothing here is imported on machines without a GPU: jax-triton refuses to
import without jaxlib's GPU support, so importing is deferred to the first
lowering.
"""
