"""Functional aten graphs, joint forward/backward tracing and min-cut partitioning.

kiln-autograd takes a ``torch.fx.GraphModule`` with torch-level ops (the capture
contract) and example inputs. It functionalizes and decomposes the graph to a fixed aten
op set, traces the joint forward and backward graph, partitions it with a min-cut
rematerialization partitioner, and runs the compiled halves inside an
``autograd.Function``.

- :func:`aot` does all of it and returns a callable that behaves like the graph.
- The stages are usable alone: :func:`trace_joint_graph`, :func:`trace_inference_graph`,
  :func:`partition`; :func:`decomposition_table`, :func:`op_set_table` and
  :func:`verify_op_set` describe and check the op set the graphs hold.
- ``aot(..., cache=...)`` keeps each signature's traced graphs as a record and rebuilds
  them from it on a warm start (:func:`is_restored`, :class:`NeedsTrace`);
  :func:`restore` rebuilds a compiled graph from its record alone, by the token
  :meth:`AOTCompiled.restore_token` gave (a caller that kept its own guards).
"""

from kiln_autograd.__about__ import __version__
from kiln_autograd.api import (
    AOTCompiled,
    aot,
    partition,
    restore,
    trace_inference_graph,
    trace_joint_graph,
)
from kiln_autograd.decompositions import (
    decomposition_table,
    op_set_table,
    register_decomposition,
    verify_op_set,
)
from kiln_autograd.errors import NeedsTrace, UnsupportedError
from kiln_autograd.partition import PartitionedGraphs
from kiln_autograd.records import (
    Unserializable,
    decode_graphs,
    encode_graphs,
    graph_code,
    is_restored,
)
from kiln_autograd.signature_cache import SignatureCache
from kiln_autograd.static_inputs import (
    STATIC_INPUTS,
    rng_state_outputs,
    saved_outputs,
    static_inputs,
    unused_seed_inputs,
    unwritten_state,
)
from kiln_autograd.trace import JointGraph, TracedGraph

__all__ = [
    "AOTCompiled",
    "JointGraph",
    "NeedsTrace",
    "PartitionedGraphs",
    "SignatureCache",
    "STATIC_INPUTS",
    "TracedGraph",
    "UnsupportedError",
    "__version__",
    "aot",
    "decomposition_table",
    "graph_code",
    "is_restored",
    "encode_graphs",
    "decode_graphs",
    "Unserializable",
    "op_set_table",
    "partition",
    "register_decomposition",
    "restore",
    "rng_state_outputs",
    "saved_outputs",
    "static_inputs",
    "trace_inference_graph",
    "trace_joint_graph",
    "unused_seed_inputs",
    "unwritten_state",
    "verify_op_set",
]
