import re

import kiln_triton


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", kiln_triton.__version__)


def test_public_api_is_pinned():
    assert sorted(kiln_triton.__all__) == [
        "TritonCodegen",
        "TritonCodegenError",
        "TritonError",
        "__version__",
        "kernel_counts",
        "start_compile_workers",
        "triton_codegen",
        "wait_for_host_builds",
    ]


def test_entry_point_object_implements_the_codegen_protocol():
    from kiln_loopir.codegen import Codegen

    assert isinstance(kiln_triton.triton_codegen, Codegen)
    assert kiln_triton.triton_codegen.device_types == ("cuda",)
