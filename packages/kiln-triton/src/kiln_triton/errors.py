"""Errors of kiln-triton."""


class TritonError(RuntimeError):
    """Base class: a caller catching it can run the graph eagerly instead."""


class TritonCodegenError(TritonError, NotImplementedError):
    """A kernel uses something the Triton generator cannot render yet."""
