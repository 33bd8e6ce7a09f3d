"""A library compiles each distinct kernel once (the others call it), and a big one is
built from several translation units at once: the same results, cached the same way."""

import ctypes

import pytest
import torch
import torch.nn.functional as F

from kiln_cpp import CppCodegen, build, kernel_counts, library
from kiln_cpp.prelude import PRELUDE
from kiln_loopir.testing import check_against_eager


def two_blocks(x, w1, b1, g1, w2, b2, g2):
    """Two identical MLP blocks with their own weights: the same kernels twice."""
    for w, b, g in ((w1, b1, g1), (w2, b2, g2)):
        x = F.layer_norm(F.gelu(x @ w + b) * 0.5 + x, (x.shape[-1],), g, None)
    return (x.softmax(-1),)


def _inputs(width=16):
    params = []
    for _ in range(2):
        params += [torch.randn(width, width), torch.randn(width), torch.randn(width)]
    return [torch.randn(4, width), *params]


@pytest.mark.parametrize("host_program", ["python", "native"])
def test_identical_blocks_compile_one_body(host_program, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path))
    codegen = CppCodegen()
    before = kernel_counts()
    compiled = check_against_eager(
        two_blocks, _inputs(), codegen=codegen, run_inputs=_inputs(), host_program=host_program
    )
    after = kernel_counts()
    built = after["built"] - before["built"]
    reused = after["reused"] - before["reused"]
    n = len(compiled.kernels) + len(compiled.launch_groups)
    assert built + reused == n and 0 < built < n, (built, reused, n)
    source = "".join(p.read_text() for p in sorted(codegen.last_library.parent.glob("*.cpp")))
    thunks = source.count("the same kernel as")
    assert thunks == reused
    # every kernel, duplicate or not, is a symbol of the library
    lib = ctypes.CDLL(str(codegen.last_library))
    assert all(hasattr(lib, k.name) for k in compiled.kernels)


def _sources():
    """Three kernels: the second is the first with other names and its parameters in
    another order (its name also in a string), the third differs in a constant."""
    return [
        "// kiln_scale_0: a header naming buf1\n"
        'extern "C" int kiln_scale_0(float* buf1, float* buf2, int64_t s0) {\n'
        '  const char* me = "kiln_scale_0";\n'
        "  for (int64_t i = 0; i < s0; ++i) buf2[i] = buf1[i] * 2.0f - 1.0f;\n"
        "  return me[0] != 'k';\n}\n",
        "// kiln_scale_1: a header naming buf9\n"
        'extern "C" int kiln_scale_1(float* buf10, float* buf9, int64_t s0) {\n'
        '  const char* me = "kiln_scale_1";\n'
        "  for (int64_t i = 0; i < s0; ++i) buf10[i] = buf9[i] * 2.0f - 1.0f;\n"
        "  return me[0] != 'k';\n}\n",
        'extern "C" int kiln_scale_2(float* buf1, float* buf2, int64_t s0) {\n'
        '  const char* me = "kiln_scale_2";\n'
        "  for (int64_t i = 0; i < s0; ++i) buf2[i] = buf1[i] * 3.0f - 1.0f;\n"
        "  return me[0] != 'k';\n}\n",
    ]


def test_duplicates_call_the_first_with_their_arguments_in_its_order(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path))
    source = library.library_source(PRELUDE, _sources())
    assert source.duplicates == {"kiln_scale_1": "kiln_scale_0"} and source.distinct == 2
    assert "return kiln_scale_0(buf9, buf10, s0);" in source.units[0]
    codegen = CppCodegen()
    k0, k1, k2 = codegen.compile(_sources())
    x = torch.randn(5)
    for kernel, args, want in [
        (k0, lambda out: (x, out, 5), x * 2 - 1),
        (k1, lambda out: (out, x, 5), x * 2 - 1),
        (k2, lambda out: (x, out, 5), x * 3 - 1),
    ]:
        out = torch.zeros(5)
        kernel(*args(out))
        torch.testing.assert_close(out, want)


def test_split_units_match_one_unit_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path))
    inputs, fresh = _inputs(), _inputs()
    single = CppCodegen()
    one = check_against_eager(two_blocks, inputs, codegen=single, run_inputs=fresh)
    assert [p.name for p in single.last_library.parent.glob("*.cpp")] == ["kernels.cpp"]
    # forced: kernels in units of one kernel on 3 compilers, the host program in its own
    monkeypatch.setenv("KILN_CPP_KERNELS_PER_UNIT", "1")
    monkeypatch.setattr(library, "CORES", 3)
    monkeypatch.setattr(library, "HOST_UNIT_MIN_CHARS", 0)
    split = CppCodegen()
    many = check_against_eager(two_blocks, inputs, codegen=split, run_inputs=fresh)
    assert many.program.native is not None
    entry = split.last_library.parent
    assert entry != single.last_library.parent
    assert sorted(p.name for p in entry.glob("*.cpp")) == [
        "host.cpp",
        "kernels0.cpp",
        "kernels1.cpp",
    ]
    assert build.cached_library(entry) == split.last_library
    torch.testing.assert_close(many(*fresh), one(*fresh), rtol=0, atol=0)
    again = CppCodegen()
    check_against_eager(two_blocks, inputs, codegen=again, run_inputs=_inputs())
    assert (again.builds, again.cache_hits) == (0, 1)
    assert again.last_library == split.last_library
