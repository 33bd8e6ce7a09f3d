"""The reference backend: kernels rendered as vectorised torch Python (slow, exact).

It checks the IR, not speed: each kernel becomes a Python function that evaluates every
node over the whole index grid at once (index variables are broadcast ``arange`` tensors,
sympy index expressions are evaluated on them), with the ops of ``runtime``.
"""

from kiln_loopir.reference.codegen import ReferenceCodegen

__all__ = ["ReferenceCodegen"]
