import re

import kiln_autograd


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", kiln_autograd.__version__)


def test_public_api_is_pinned():
    assert sorted(kiln_autograd.__all__) == [
        "AOTCompiled",
        "JointGraph",
        "NeedsTrace",
        "PartitionedGraphs",
        "STATIC_INPUTS",
        "SignatureCache",
        "TracedGraph",
        "Unserializable",
        "UnsupportedError",
        "__version__",
        "aot",
        "decode_graphs",
        "decomposition_table",
        "encode_graphs",
        "graph_code",
        "is_restored",
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


def test_public_names_exist():
    for name in kiln_autograd.__all__:
        assert hasattr(kiln_autograd, name), name
