"""On a CUDA device: kiln-loopir's op table and whole models against eager (run through
the GPU entry point, integration/gpu.py)."""

import importlib.util
import pathlib
import sys

import pytest
import torch

from kiln_loopir.testing import check_against_eager, compare_outputs, compile_fn
from kiln_loopir.testing.cases import CASES
from kiln_triton import TritonCodegen

ROOT = pathlib.Path(__file__).resolve().parents[3]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(autouse=True)
def host_built_before_the_compile_returns(monkeypatch):
    """The native host programs these tests check run from their first call (by default,
    the Python one runs a graph until the C++ compiler is done: the last test here)."""
    monkeypatch.setenv("KILN_TRITON_HOST_BUILD", "wait")


def _load(path: pathlib.Path, name: str):
    """A benchmark module by its path, its folder importable (its helpers beside it)."""
    if not path.exists():
        return None
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
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
    assert stats.get("native"), "no graph ran its native host program"
    # as close to the fp32 result as eager in bf16 is (both round to bf16 differently)
    assert err_kiln <= max(2 * err_eager, 0.02 * scale), (err_kiln, err_eager, scale)


def _block(x, w, b):
    h = torch.addmm(b, x, w)  # an ATen call (cuBLAS) between kernels
    return torch.nn.functional.gelu(h) * 2 + x.sum(1, keepdim=True), h.softmax(-1), x.t()


def _block_inputs():
    return [
        torch.randn(64, 128, device="cuda"),
        torch.randn(128, 128, device="cuda") / 11,
        torch.randn(128, device="cuda"),
    ]


def test_native_host_program_launches_through_the_driver():
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln_loopir import compile_fx

    inputs = _block_inputs()
    gm = make_fx(_block, tracing_mode="fake")(*inputs)
    compiled = compile_fx(gm, inputs, codegen=TritonCodegen(), host_program="native")
    assert type(compiled.program.call).__name__ == "Program"
    assert "cuda_launch" in compiled.native_host.source
    fresh = _block_inputs()
    got, want = compiled.program.call(*fresh), _block(*fresh)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        assert g.stride() == w.stride()
    # the same launches as the Python host program
    python = compile_fx(gm, inputs, codegen=TritonCodegen(), host_program="python")
    assert python.program.native is None

    def kernels(fn):  # Kiln's (cuBLAS picks the product's kernels for each caller)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(*fresh)
            torch.cuda.synchronize()
        names = (e.name for e in prof.events() if e.device_type.name == "CUDA")
        return sorted(name for name in names if name.startswith("kiln_"))

    assert kernels(compiled.program.call) == kernels(python.program.call)


def test_a_native_host_program_built_in_the_background_takes_over_once_built(monkeypatch, tmp_path):
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln_loopir import compile_fx
    from kiln_triton.host_builds import wait_for_host_builds

    monkeypatch.delenv("KILN_TRITON_HOST_BUILD")
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path))  # no library cached: built now
    inputs = _block_inputs()
    gm = make_fx(_block, tracing_mode="fake")(*inputs)
    compiled = compile_fx(gm, inputs, codegen=TritonCodegen(), host_program="native")
    program = compiled.program.call
    assert type(program).__name__ == "Program"
    fresh = _block_inputs()
    first = program(*fresh)  # the Python host program, unless the build was that quick
    wait_for_host_builds()
    assert program.started, "the library built in the background was not started"
    assert list(tmp_path.glob("*/*.so")), "the library is not in the cache"
    second, want = program(*fresh), _block(*fresh)
    for a, b, w in zip(first, second, want, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b, w, rtol=1e-4, atol=1e-4)


def _products(x, w, b, wt):
    h = torch.addmm(b, x, w)  # a bias over the columns: cuBLASLt's bias epilogue
    g = torch.mm(x[:, 8:72], wt.t()[8:72])  # views: an offset, an operand stored by columns
    return torch.relu(h) + g.sum(), torch.mm(h.t(), x)  # an operand stored by columns


def _products_inputs(dtype):
    def randn(*size):
        return torch.randn(*size, device="cuda", dtype=dtype)

    return [randn(48, 96), randn(96, 80) / 10, randn(80), randn(80, 96) / 8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_native_host_program_multiplies_matrices_through_cublaslt(dtype):
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln_loopir import compile_fx

    inputs = _products_inputs(dtype)
    gm = make_fx(_products, tracing_mode="fake")(*inputs)
    compiled = compile_fx(gm, inputs, codegen=TritonCodegen(), host_program="native")
    source = compiled.native_host.source
    assert source.count("kiln_api->cuda_gemm(") == 3, source
    assert "call_extern" not in source  # no product through ATen
    tolerance = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}[dtype]
    for _ in range(2):
        fresh = _products_inputs(dtype)
        got, want = compiled.program.call(*fresh), _products(*fresh)
        for g, w in zip(got, want, strict=True):
            scale = w.abs().max().item()
            torch.testing.assert_close(g, w, rtol=tolerance, atol=tolerance * scale)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        compiled.program.call(*fresh)
        torch.cuda.synchronize()
    aten = [e.name for e in prof.events() if e.name in ("aten::mm", "aten::addmm")]
    assert not aten, aten


def _heads(x, heads):  # [batch, length, heads * dim] -> [batch, heads, length, dim], a view
    b, n, _ = x.shape
    return x.view(b, n, heads, -1).transpose(1, 2)


def _flash_causal(x, w):
    q, k, v = (_heads(t, 4) for t in (x @ w).chunk(3, dim=-1))
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]
    return (out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1) * 2,)


def _efficient_masked(x, w, bias):
    q, k, v = (_heads(t, 4) for t in (x @ w).chunk(3, dim=-1))
    bias = bias.expand(x.shape[0], 4, x.shape[1], x.shape[1])
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, False, 0.0, False, scale=0.2
    )[0]
    return (out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1) + 1,)


def _grouped_masked(x, w, bias):  # 4 query heads, 2 key and value heads
    q, k, v, _ = (x @ w).split([256, 128, 128, 256], dim=-1)
    b, n = x.shape[:2]
    out = torch.ops.kiln_loopir.grouped_attention(
        _heads(q, 4), _heads(k, 2), _heads(v, 2), bias, False, 0.125, [4 * n * 64, n * 64, 64, 1]
    )
    return (out.transpose(1, 2).reshape(b, n, -1) - 1,)


@pytest.mark.parametrize(
    ("fn", "dtype"),
    [
        (_flash_causal, torch.bfloat16),
        (_efficient_masked, torch.float16),
        (_efficient_masked, torch.float32),
        (_grouped_masked, torch.bfloat16),
    ],
)
def test_native_host_program_computes_attention_with_its_own_kernel(fn, dtype):
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln_loopir import compile_fx

    n = 100 if fn is _flash_causal else 96  # a bias's rows 16-element aligned, as ATen asks

    def inputs():
        x = torch.randn(2, n, 256, device="cuda", dtype=dtype)
        w = torch.randn(256, 768, device="cuda", dtype=dtype) / 16
        bias = torch.randn(2, 1, n, n, device="cuda", dtype=dtype)
        bias[:, :, :, n - 10 :] = float("-inf")  # keys masked out
        return [x, w, bias][: 2 if fn is _flash_causal else 3]

    example = inputs()
    gm = make_fx(fn, tracing_mode="fake")(*example)
    compiled = compile_fx(gm, example, codegen=TritonCodegen(), host_program="native")
    source = compiled.native_host.source
    assert "attention_fwd" in source and "call_extern" not in source, source
    # the Python program (a first call's, while the native one builds) launches it too
    ((name, launch),) = compiled.native_host.python_externs.values()
    assert f"{name} = own_kernel({name!r}, " in compiled.host_source
    assert compiled.program.python_call.__globals__[name] is launch
    for _ in range(2):
        fresh = inputs()
        (got,), (want,) = compiled.program.call(*fresh), fn(*fresh)
        (python,) = compiled.program.python_call(*fresh)
        scale = want.float().abs().max().item()
        tol = 1e-4 if dtype == torch.float32 else 2e-2  # float32: full float32 products
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)
        torch.testing.assert_close(python, got, rtol=tol, atol=tol * scale)


def test_native_host_program_hands_misaligned_inputs_to_python():
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln_loopir import compile_fx

    inputs = _block_inputs()
    gm = make_fx(_block, tracing_mode="fake")(*inputs)
    compiled = compile_fx(gm, inputs, codegen=TritonCodegen(), host_program="native")
    storage = torch.randn(64 * 128 + 1, device="cuda")
    x = storage[1:].view(64, 128)  # 4 bytes past an aligned address
    assert x.data_ptr() % 16
    w, b = _block_inputs()[1:]
    got, want = compiled.program.call(x, w, b), _block(x, w, b)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_a_graph_compiles_its_launch_configurations_before_the_first_launch():
    """Every configuration a big static kernel may be timed with is compiled in parallel
    when the graph compiles (``precompile``), not one after the other at its first launch."""

    def fn(x, w):
        return torch.nn.functional.layer_norm(torch.relu(x @ w) + x, (1024,)).softmax(-1)

    codegen = TritonCodegen()
    x, w = torch.randn(1024, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")
    check_against_eager(fn, [x, w], codegen=codegen)
    assert codegen.precompiled > 1, "no configuration was compiled ahead of the first launch"


@pytest.mark.parametrize("host_program", ["python", "native"])
def test_kernels_compiled_in_worker_processes_launch_and_match_eager(host_program):
    """A graph's kernels are compiled in the compile workers when it compiles; their first
    launches run those binaries (loaded from Triton's cache), with eager's results."""
    from kiln_triton import precompiled
    from kiln_triton.compile_pool import compile_workers

    if compile_workers() is None:
        pytest.skip("KILN_TRITON_COMPILE_WORKERS=0: compiled in threads")

    width = 96 if host_program == "python" else 80  # sizes of its own: nothing held yet

    def fn(x, y):
        h = torch.relu(x * 3 + y) - 0.5
        return h.softmax(-1), (h * x).sum(0), torch.nn.functional.layer_norm(h, (width,))

    codegen = TritonCodegen()
    x, y = torch.randn(200, width, device="cuda"), torch.randn(200, width, device="cuda")
    compiled = check_against_eager(fn, [x, y], codegen=codegen, host_program=host_program)
    assert codegen.precompiled > 0, "nothing was compiled in the workers"
    for k in compiled.kernels:
        launch = k.fn._launches[()]
        expected = precompiled.binary(k.fn.source_hash, launch.config, launch.numels)
        assert expected is not None and launch.compiled is expected, k.name


def test_a_new_size_launches_a_compiled_kernel_that_runs_it():
    """A kernel whose sizes are arguments, called at a new size of a configuration met
    before, launches directly the kernel compiled for the earlier size: Triton compiled
    its sizes for any value (``KILN_TRITON_SPECIALIZE_SIZES`` unset), so nothing compiles
    at the new size, whether the sizes are multiples of 16 or not. Results equal eager's
    at every size. (The Python host program's launcher: the native one plans these sizes
    itself, see the next test.)"""
    from kiln_triton.launcher import compiled_at_launch

    def fn(a):
        return torch.softmax(a * 2, -1) + 1

    compiled = compile_fn(fn, [torch.randn(5, 32, device="cuda")], codegen=TritonCodegen(),
                          dynamic=True, host_program="python")  # fmt: skip
    compare_outputs(compiled(x := torch.randn(5, 32, device="cuda")), [fn(x)])
    launchers = [k.fn for k in compiled.kernels]
    firsts = [next(iter(f._launches.values())) for f in launchers]
    assert all(f.compiled is not None for f in firsts), "not compiled for direct launches"
    # rows in (4, 8], widths in (16, 32]: one power-of-two bucket each, so one configuration
    news, before = [], compiled_at_launch()
    for rows, width in [(6, 21), (7, 27), (6, 32)]:
        x = torch.randn(rows, width, device="cuda")
        known = [set(f._launches) for f in launchers]
        compare_outputs(compiled(x), [fn(x)])
        new = [[f._launches[s] for s in f._launches if s not in k]
               for f, k in zip(launchers, known, strict=True)]  # fmt: skip
        news.append([launch for (launch,) in new])
    assert compiled_at_launch() == before, "a new size compiled a kernel"
    for first, *later in zip(firsts, *news, strict=True):
        assert all(launch.compiled is first.compiled for launch in later)


def _rows_block(x, w, b):
    h = torch.addmm(b, x, w)  # an ATen call at a symbolic size
    return torch.softmax(h * 2, -1) + x.sum(1, keepdim=True), x.t().contiguous()


def _rows_inputs(rows: int):
    return [
        torch.randn(rows, 96, device="cuda"),
        torch.randn(96, 96, device="cuda") / 10,
        torch.randn(96, device="cuda"),
    ]


def test_native_host_program_learns_the_families_of_new_sizes():
    from kiln_loopir.testing import compile_symbolic

    compiled = compile_symbolic(
        _rows_block, _rows_inputs(40), codegen=TritonCodegen(), host_program="native"
    )
    assert compiled.graph.size_hints, "compiled with symbolic sizes"
    assert "kiln_find_family" in compiled.native_host.source
    table = compiled.native_host.program.learn_sizes
    # 41 and 42 are in 40's families: rows and rows x 96 neither 1 nor multiples of 16,
    # and in the same power-of-two buckets
    for rows in (40, 77, 40, 77, 131, 131, 41, 42):
        fresh = _rows_inputs(rows)
        got, want = compiled(*fresh), _rows_block(*fresh)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
            assert g.stride() == w.stride()
    # the first call at each new family ran the Python program; the others, C++ alone
    assert table.handed_back == 3 and table.learned > 0
