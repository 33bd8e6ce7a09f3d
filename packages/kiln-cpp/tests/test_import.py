import re

import kiln_cpp


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", kiln_cpp.__version__)


def test_public_api_is_pinned():
    assert sorted(kiln_cpp.__all__) == [
        "CppCodegen",
        "CppCodegenError",
        "CppCompileError",
        "CppError",
        "__version__",
        "cache_root",
        "cpp_codegen",
        "kernel_counts",
    ]


def test_entry_point_resolves_to_the_codegen():
    from kiln_loopir.codegen import installed_codegens

    found = dict(installed_codegens())
    assert found["cpp"] is kiln_cpp.cpp_codegen
    assert kiln_cpp.cpp_codegen.device_types == ("cpu",)
