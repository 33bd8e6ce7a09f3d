"""Functional aten graphs, joint forward/backward tracing and min-cut partitioning.

kiln-autograd takes a ``torch.fx.GraphModule`` with torch-level ops (the capture
contract) and example inputs. It functionalizes and decomposes the graph to a fixed aten
op set, traces the joint forward and backward graph, partitions it with a min-cut
rematerialization partitioner, and runs the compiled halves inside an
``autograd.Function``.

This release holds the package's metadata only: the API arrives in 0.1.
"""

from kiln_autograd.__about__ import __version__

__all__ = ["__version__"]
