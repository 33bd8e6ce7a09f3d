"""Kernels are C functions named for their ops: the symbols of the built library (what
perf and torch.profiler show) carry the names."""

import ctypes
import shutil
import subprocess

import torch
import torch.nn.functional as F

from kiln_cpp import CppCodegen
from kiln_loopir.testing import check_against_eager


def _block(x, w, b, w1):
    return F.gelu(F.layer_norm(x, (8,), w, b)), F.relu(x @ w1 + 1.0).softmax(-1)


def _exported(library) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:  # the loader finds each of them
        return set()
    out = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_library_symbols_carry_the_kernel_names():
    codegen = CppCodegen()
    inputs = [torch.randn(4, 8), torch.randn(8), torch.randn(8), torch.randn(8, 6)]
    compiled = check_against_eager(_block, inputs, codegen=codegen)
    names = [k.name for k in compiled.kernels]
    assert any("layer_norm" in n and "gelu" in n for n in names), names
    assert any("softmax" in n for n in names), names
    library = ctypes.CDLL(str(codegen.last_library))
    exported = _exported(codegen.last_library)
    for kernel in compiled.kernels:
        assert kernel.name.startswith("kiln_")
        assert f'extern "C" int {kernel.name}(' in kernel.source
        assert hasattr(library, kernel.name)
        assert not exported or kernel.name in exported, sorted(exported)
        assert repr(kernel.fn) == f"CppKernel({kernel.name})"
        launched = [compiled.host_source, *(g.source for g in compiled.launch_groups)]
        assert any(f"{kernel.name}(" in source for source in launched)
