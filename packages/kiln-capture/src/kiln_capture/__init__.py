"""Bytecode capture with guards.

kiln-capture turns a Python function or ``nn.Module`` into ``torch.fx`` graphs by
interpreting its bytecode symbolically with fake tensors. Each captured frame gets a
guard function (generated Python source) that decides when the capture can be reused,
new bytecode that calls the compiled graph and replays Python side effects, and
resume functions where the graph breaks. Any ``torch.compile``-style backend
``backend(gm, example_inputs) -> callable`` can compile the graphs.

This release holds the package's metadata only: the capture API arrives in 0.1.
"""

from kiln_capture.__about__ import __version__

__all__ = ["__version__"]
