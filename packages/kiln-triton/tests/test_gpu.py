"""On a CUDA device: kiln-loopir's op table and whole models against eager (run through
the GPU entry point, integration/gpu.py)."""

import importlib.util
import pathlib

import pytest
import torch

from kiln_loopir.testing import check_against_eager
from kiln_loopir.testing.cases import CASES
from kiln_triton import TritonCodegen

ROOT = pathlib.Path(__file__).resolve().parents[3]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _load(path: pathlib.Path, name: str):
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name, dtype",
    [(name, d) for name, case in sorted(CASES.items()) for d in case.dtypes],
    ids=lambda v: str(v).removeprefix("torch."),
)
def test_loopir_op_table_on_gpu(name, dtype):
    case = CASES[name]
    cuda = [x.cuda() if isinstance(x, torch.Tensor) else x for x in case.inputs(dtype)]
    with torch.device("cuda"):
        check_against_eager(case.fn, cuda, codegen=TritonCodegen())


MODELS = ["bert", "gpt2", "llama", "resnet50", "vit_base_patch16_224", "convnext_tiny"]


def small_model(name: str):
    """The model at a small batch, transformers with two layers (kiln-loopir's scheduler
    takes minutes on a full-depth graph; the layers repeat one another)."""
    bench = _load(ROOT / "integration/benchmarks/bench_triton.py", "bench_triton")
    if name in ("bert", "gpt2", "llama"):
        return getattr(bench, name)(batch=2, seq=64, layers=2)
    pytest.importorskip("timm")
    depth = {"vit_base_patch16_224": {"depth": 2}, "convnext_tiny": {"depths": (1, 1, 1, 1)}}
    return bench.timm_model(name, batch=2, **depth.get(name, {}))()


@pytest.mark.parametrize("name", MODELS)
def test_bf16_inference_equals_eager(name):
    # an end-to-end test: it needs the other Kiln packages, which kiln-triton does not declare
    pytest.importorskip("transformers")
    pytest.importorskip("kiln_autograd")
    kiln_capture = pytest.importorskip("kiln_capture")
    bench = _load(ROOT / "integration/benchmarks/bench_triton.py", "bench_triton")
    model, inputs = bench.prepare_model(lambda: small_model(name))

    stats: dict = {}
    kiln = kiln_capture.capture(model, bench.kiln_backend(stats))
    err_kiln, err_eager, scale = bench.check_model(model, inputs, kiln)
    assert stats.get("graphs"), "the model ran eagerly: nothing was compiled"
    # as close to the fp32 result as eager in bf16 is (both round to bf16 differently)
    assert err_kiln <= max(2 * err_eager, 0.02 * scale), (err_kiln, err_eager, scale)
