"""Kiln: a compiler for PyTorch programs.

The umbrella package wires Kiln's packages together: bytecode capture (kiln-capture),
autograd graph splitting (kiln-autograd), the loop IR and scheduler (kiln-loopir), code
generation for each device (kiln-triton, kiln-cpp, found through the ``kiln.codegen``
entry points) and the CUDA-graph runtime (kiln-cudagraphs, found through
``kiln.runtime``).

This release provides plug-in discovery (``list_backends``); ``kiln.compile`` arrives in
0.1.
"""

from kiln.__about__ import __version__
from kiln._plugins import Plugin, list_backends

__all__ = ["Plugin", "__version__", "list_backends"]
