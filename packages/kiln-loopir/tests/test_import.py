import re

import kiln_loopir


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", kiln_loopir.__version__)


def test_public_api_is_pinned():
    assert sorted(kiln_loopir.__all__) == [
        "Buffer",
        "CONVOLUTION_RELU",
        "Codegen",
        "CompiledGraph",
        "CompiledKernel",
        "ComputedNode",
        "ExternNode",
        "GROUPED_ATTENTION",
        "HostProgram",
        "IRError",
        "Kernel",
        "LoopGraph",
        "MemoryPlan",
        "Pointwise",
        "Reduction",
        "ReferenceCodegen",
        "Scatter",
        "Schedule",
        "TensorRef",
        "TraceHandler",
        "__version__",
        "compile_fx",
        "convolution_relu",
        "decompose",
        "eliminate_dead_nodes",
        "fuse",
        "generate_host",
        "grouped_attention",
        "kernel_launch_args",
        "load_host_program",
        "lower",
        "lowered_ops",
        "order",
        "plan_memory",
        "register_lowering",
        "resolve_codegen",
        "schedule_graph",
        "unfused_schedule",
    ]
    for name in kiln_loopir.__all__:
        assert hasattr(kiln_loopir, name)
