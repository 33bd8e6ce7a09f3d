"""The native host program: kernels and host program in one library, run through the host
runtime, against eager and the Python host program."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln_cpp.host.arena import ALIGNMENT, plan_arena
from kiln_cpp.host.render import fills_out
from kiln_loopir import compile_fx
from kiln_loopir.scheduler import step_reads, step_writes


def _compile(fn, inputs, host_program="native", tracing_mode="fake"):
    gm = make_fx(fn, tracing_mode=tracing_mode)(*inputs)
    return compile_fx(gm, inputs, codegen="cpp", host_program=host_program)


def mlp(x, *params):
    for i in range(0, len(params), 2):
        x = torch.relu(torch.addmm(params[i + 1], x, params[i].t()))
    return (x,)


def _mlp_inputs(batch=1, width=32, layers=4):
    params = []
    for _ in range(layers):
        params += [torch.randn(width, width) / width**0.5, torch.randn(width)]
    return [torch.randn(batch, width), *params]


def test_mlp_runs_natively_and_matches_eager():
    inputs = _mlp_inputs()
    compiled = _compile(mlp, inputs)
    assert compiled.program.native is not None
    assert type(compiled.program.call).__name__ == "Program"
    assert "kiln_host_call" in compiled.native_host.source
    fresh = _mlp_inputs()
    (got,) = compiled.program.call(*fresh)
    torch.testing.assert_close(got, mlp(*fresh)[0])
    (checked,) = compiled(*fresh)  # with the layout checks first
    torch.testing.assert_close(checked, got)


def test_matches_the_python_host_program():
    inputs = _mlp_inputs(batch=8, width=64)
    native = _compile(mlp, inputs)
    python = _compile(mlp, inputs, host_program="python")
    assert python.program.native is None and native.program.native is not None
    fresh = _mlp_inputs(batch=8, width=64)
    torch.testing.assert_close(native(*fresh)[0], python(*fresh)[0])


def test_a_pending_program_runs_its_fallback_until_its_library_starts():
    from kiln_cpp.codegen import pending_program, start_program

    inputs = _mlp_inputs()
    compiled = _compile(mlp, inputs)
    host = compiled.native_host
    pending = pending_program(host)
    assert not pending.started
    with pytest.raises(RuntimeError, match="not built yet"):
        pending(*inputs)
    ran = []

    def python(*args):
        ran.append(len(args))
        return compiled.program.python_call(*args)

    pending.set_fallback(python)
    params = tuple(_mlp_inputs()[1:])
    bound = pending.bind_last(params)  # made before the start: it starts with it
    x = torch.randn(1, 32)
    (before,) = bound(x)
    assert ran == [len(inputs)], "the fallback ran the call, with every input"
    start_program(pending, host.program.library, host)
    assert pending.started and bound.started
    (after,) = bound(x)
    assert ran == [len(inputs)], "the library ran the call"
    want = mlp(x, *params)[0]
    torch.testing.assert_close(before, want)
    torch.testing.assert_close(after, want)
    with pytest.raises(RuntimeError, match="started already"):
        start_program(pending, host.program.library, host)


def attention_block(x, w_qkv, b_qkv, w_out):
    qkv = torch.addmm(b_qkv, x, w_qkv)  # large enough to stay an ATen call
    q, k, v = (t.reshape(1, 64, 4, 32).transpose(1, 2) for t in qkv.split(128, dim=1))
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    y = a.transpose(1, 2).reshape(64, 128) @ w_out
    return torch.tanh(y) + x, x.t()


def test_extern_ops_views_and_outputs_that_view_inputs():
    def inputs():
        return [
            torch.randn(64, 128),
            torch.randn(128, 384) / 12,
            torch.randn(384),
            torch.randn(128, 128) / 12,
        ]

    compiled = _compile(attention_block, inputs())
    assert compiled.program.native is not None
    source = compiled.native_host.source
    assert "call_extern" in source
    assert any(call.overload == "out" for call in compiled.native_host.externs)  # addmm.out
    fresh = inputs()
    got = compiled(*fresh)
    want = attention_block(*fresh)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert got[1].stride() == want[1].stride()
    assert got[1].data_ptr() == fresh[0].data_ptr()  # a view of the input, as eager
    torch.testing.assert_close(got[1], want[1])


def test_intermediates_share_one_allocation_per_call():
    inputs = _mlp_inputs(batch=8, width=64, layers=6)
    compiled = _compile(mlp, inputs)
    source = compiled.native_host.source
    assert "kiln_arena_block" in source
    # the arena and the one output: no allocation per intermediate
    assert source.count("kiln_api->empty_strided(") == 2
    for _ in range(3):  # a fresh block each call: outputs of earlier calls stay intact
        fresh = _mlp_inputs(batch=8, width=64, layers=6)
        torch.testing.assert_close(compiled(*fresh)[0], mlp(*fresh)[0], rtol=1e-4, atol=1e-5)


def _live_steps(schedule, name: str) -> tuple[int, int]:
    steps = [
        i for i, step in enumerate(schedule.steps) if name in step_reads(step) | step_writes(step)
    ]
    return steps[0], steps[-1]


@pytest.mark.parametrize("case", ["mlp", "attention"])
def test_arena_buffers_live_at_once_never_overlap(case):
    if case == "mlp":
        compiled = _compile(mlp, _mlp_inputs(batch=4, width=48, layers=5))
    else:
        inputs = [
            torch.randn(64, 128),
            torch.randn(128, 384),
            torch.randn(384),
            torch.randn(128, 128),
        ]
        compiled = _compile(attention_block, inputs)
    schedule, plan = compiled.schedule, compiled.memory_plan
    kept = {o.buffer for o in compiled.graph.outputs}
    arena = plan_arena(schedule, plan, kept, _out_filled(schedule))
    assert arena.offsets and not kept & set(arena.offsets)
    shared = {}  # a buffer that takes another's storage, and that buffer
    for sp in plan.steps:
        shared |= {**sp.reuse, **sp.in_place}

    def storage(name):
        while name in shared:
            name = shared[name]
        return name

    buffers = compiled.graph.buffers()
    names = sorted(arena.offsets)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if storage(a) == storage(b):
                assert arena.offsets[a] == arena.offsets[b]
                continue
            (a0, a1), (b0, b1) = _live_steps(schedule, a), _live_steps(schedule, b)
            ra = (arena.offsets[a], arena.offsets[a] + int(buffers[a].nbytes()))
            rb = (arena.offsets[b], arena.offsets[b] + int(buffers[b].nbytes()))
            if a0 <= b1 and b0 <= a1:
                assert ra[1] <= rb[0] or rb[1] <= ra[0], f"{a} and {b} overlap while both live"
    assert arena.size % ALIGNMENT == 0
    assert all(offset % ALIGNMENT == 0 for offset in arena.offsets.values())


def _out_filled(schedule) -> dict[int, list[str]]:
    return {i: [fills_out(s)] for i, s in enumerate(schedule.steps) if fills_out(s)}


def test_an_index_out_of_range_raises_index_error():
    def gather(table, idx):
        return (table[idx] * 2,)

    table, idx = torch.randn(10, 8), torch.randint(0, 10, (6,))
    compiled = _compile(gather, [table, idx])
    assert compiled.program.native is not None
    torch.testing.assert_close(compiled(table, idx)[0], table[idx] * 2)
    with pytest.raises(IndexError, match="out of range"):
        compiled.program.call(table, torch.tensor([0, 1, 2, 3, 4, 99]))


def test_bad_calls_name_the_problem():
    inputs = _mlp_inputs()
    call = _compile(mlp, inputs).program.call
    with pytest.raises(TypeError, match="takes 9 inputs, got 1"):
        call(inputs[0])
    with pytest.raises(TypeError, match="input 0 is a float"):
        call(1.0, *inputs[1:])


def test_constants_are_bound_after_the_inputs():
    def shifted(x):
        return (x + torch.tensor([1.0, 2.0, 3.0, 4.0]),)

    x = torch.randn(3, 4)
    compiled = _compile(shifted, [x])
    assert compiled.graph.constants, "the traced graph keeps the tensor as a constant"
    assert compiled.program.native is not None
    fresh = torch.randn(3, 4)
    torch.testing.assert_close(compiled(fresh)[0], shifted(fresh)[0])


def test_symbolic_sizes_are_bound_from_the_inputs():
    def block(x, w):
        h = torch.relu(x @ w)  # a product too big to inline: an ATen call with a size
        return h.reshape(-1).softmax(0) * x.shape[0], h.sum(1)

    x, w = torch.randn(40, 64), torch.randn(64, 96)
    compiled = _compile(block, [x, w], tracing_mode="symbolic")
    assert compiled.program.native is not None
    source = compiled.native_host.source
    assert "kiln_api->size(" in source and "std::array<int64_t" in source
    for rows in (40, 7, 129):
        fresh = [torch.randn(rows, 64), w]
        for got, want in zip(compiled.program.call(*fresh), block(*fresh), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_sizes_pass_to_extern_ops_at_each_call():
    def padded(x):
        return (torch.cat([x, x.new_full((x.shape[0], 3), 2.0)], 1) * x.shape[0],)

    x = torch.randn(12, 16)
    compiled = _compile(padded, [x], tracing_mode="symbolic")
    assert compiled.program.native is not None
    assert any(call.sizes for call in compiled.native_host.externs)  # a size the call passes
    for rows in (12, 3, 50):
        fresh = torch.randn(rows, 16)
        torch.testing.assert_close(compiled.program.call(fresh)[0], padded(fresh)[0])


def test_inputs_unlike_the_graph_are_refused_by_the_python_program():
    x = torch.randn(5, 8)
    compiled = _compile(lambda a: (a.sin() * 2,), [x], tracing_mode="symbolic")
    assert compiled.program.native is not None
    strided = torch.randn(8, 5).t()  # the graph was traced for contiguous rows
    with pytest.raises(ValueError, match="stride"):
        compiled.program.call(strided)


def test_sizes_read_from_data_run_the_python_host_program(caplog):
    def first_n(x, n):
        return (x[: n.item()] * 2,)

    from kiln_loopir.testing import compile_fn

    x, n = torch.randn(10), torch.tensor(4)
    with caplog.at_level(logging.INFO, logger="kiln.loopir"):
        compiled = compile_fn(first_n, [x, n], codegen="cpp")
    assert compiled.program.native is None
    assert any("host program: Python" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(compiled(x, torch.tensor(7))[0], x[:7] * 2)


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="host_program='fast'"):
        _compile(mlp, _mlp_inputs(), host_program="fast")


def test_none_for_a_tensor_argument_is_an_undefined_tensor():
    from kiln_cpp.host import load_runtime
    from kiln_cpp.host.externs import _Encoder

    encode = _Encoder(None, None, None, "op")
    assert encode(None, "Tensor") == ("undefined",)
    assert encode(None, "Optional[Tensor]") == ("none",)
    # the runtime prepares it (an ATen binding turns None into an undefined tensor too)
    load_runtime().Extern("aten::add", "Tensor", [("t", 0), ("undefined",), ("default",)], 1)


@pytest.fixture
def fresh_runtime(monkeypatch, tmp_path):
    """kiln-cpp's runtime module as in a new process of a new installation (its folder
    ``tmp_path``), built by the function given to the returned ``use``."""
    from kiln_cpp.host import runtime

    def use(build):
        monkeypatch.setattr(runtime, "_FAILED", [])
        monkeypatch.setattr(runtime, "_STARTED", [])
        monkeypatch.setattr(runtime, "_build", build)
        monkeypatch.setenv("KILN_CPP_RUNTIME_DIR", str(tmp_path))
        runtime._load_runtime.cache_clear()
        return runtime

    yield use
    runtime._load_runtime.cache_clear()


def _failing_build(calls):
    from kiln_cpp.errors import CppCompileError

    def build(cxx, target):
        calls.append(target)
        raise CppCompileError("no Python.h")

    return build


def test_a_runtime_that_cannot_build_fails_once(fresh_runtime):
    from kiln_cpp.errors import CppCompileError

    calls = []
    runtime = fresh_runtime(_failing_build(calls))
    for _ in range(3):
        with pytest.raises(CppCompileError, match="no Python.h"):
            runtime.load_runtime()
    assert len(calls) == 1
    # and a graph then runs its Python host program
    compiled = _compile(mlp, _mlp_inputs(), host_program="auto")
    assert compiled.program.native is None


def test_a_runtime_built_in_the_background_is_the_one_loaded(fresh_runtime, tmp_path):
    import threading

    from kiln_cpp.host import runtime as real

    built, release = [], threading.Event()
    real_build = real._build

    def slow_build(cxx, target):
        assert threading.current_thread().name == "kiln-cpp-runtime"
        release.wait(30)  # load_runtime is called while the build still runs
        built.append(target)
        real_build(cxx, target)

    runtime = fresh_runtime(slow_build)
    runtime.start_loading()
    runtime.start_loading()  # once per process
    assert len(runtime._STARTED) == 1
    release.set()
    module = runtime.load_runtime()  # waits for the background build, builds nothing
    assert len(built) == 1 and built[0].parent.parent == tmp_path
    assert module is runtime.load_runtime()
    assert hasattr(module, "TensorsMatch")


def test_a_failed_background_build_is_raised_by_the_first_load(fresh_runtime):
    from kiln_cpp.errors import CppCompileError

    calls = []
    runtime = fresh_runtime(_failing_build(calls))
    runtime.start_loading()
    runtime._STARTED[0].join(30)
    assert len(calls) == 1
    with pytest.raises(CppCompileError, match="no Python.h"):
        runtime.load_runtime()
    assert len(calls) == 1  # raised again, not built again


def test_the_background_load_also_asks_the_compiler_for_its_optional_flags(
    fresh_runtime, monkeypatch
):
    """The first library build would run the compiler's probes otherwise (a cold cache)."""
    from kiln_cpp import build

    asked = []
    runtime = fresh_runtime(_failing_build([]))  # the probes are asked all the same
    monkeypatch.setattr(build, "optional_flags", lambda path: asked.append(path) or ((), ()))
    runtime.start_loading()
    runtime._STARTED[0].join(30)
    assert asked == [build.compiler()]


def test_random_ops_draw_their_seed_natively_as_the_python_program_does():
    def noisy(x):
        return (x * (torch.rand_like(x) > 0.5) + torch.randn_like(x),)

    x = torch.randn(64, 32)
    native = _compile(noisy, [x])
    python = _compile(noisy, [x], host_program="python")
    assert native.program.native is not None
    assert "aten.randint.low" in [call.op_name for call in native.native_host.externs]
    torch.manual_seed(7)
    got = native.program.call(x)[0]
    torch.manual_seed(7)
    want = python.program.call(x)[0]
    assert torch.equal(got, want)  # the same seed from the same generator: the same numbers
    assert not torch.equal(native.program.call(x)[0], got)  # a fresh seed at each call


def test_errors_keep_the_type_eager_raises():
    def solve(a, b):
        return (torch.linalg.solve_ex(a, b).result * 2,)

    a, b = torch.randn(4, 4), torch.randn(4, 2)
    compiled = _compile(solve, [a, b])
    assert compiled.program.native is not None
    torch.testing.assert_close(compiled(a, b)[0], solve(a, b)[0], rtol=1e-4, atol=1e-4)

    def inverse(a):
        return (torch.ops.aten.linalg_inv_ex(a, check_errors=True)[0] + 1,)

    compiled = _compile(inverse, [a])
    assert compiled.program.native is not None
    with pytest.raises(torch.linalg.LinAlgError):
        inverse(torch.zeros(4, 4))  # eager's type
    with pytest.raises(torch.linalg.LinAlgError):
        compiled.program.call(torch.zeros(4, 4))


def test_empty_int_lists_and_sparse_results_pass_through_extern_calls():
    def ops(x):
        return x.repeat([]) * 2, x.reshape(1).to_sparse()

    x = torch.randn(())
    compiled = _compile(ops, [x])
    assert compiled.program.native is not None
    fresh = torch.randn(())
    got, want = compiled.program.call(fresh), ops(fresh)
    torch.testing.assert_close(got[0], want[0])
    assert got[1].layout == torch.sparse_coo
    torch.testing.assert_close(got[1].to_dense(), want[1].to_dense())


def test_out_overloads_are_used_only_where_the_device_has_a_kernel_for_them():
    from kiln_cpp.host.externs import out_variant

    aten = torch.ops.aten
    assert out_variant(aten.addmm.default, "cpu") is aten.addmm.out
    # ATen's generated convolution.out computes a new tensor, then copies it into out
    assert out_variant(aten.convolution.default) is aten.convolution.out
    assert out_variant(aten.convolution.default, "cpu") is None
    assert out_variant(aten.convolution.default, "cuda") is None


def _scatter_into_a_temporary(x, y):
    a = x * 2  # temporaries the arena holds at once: one lies past the arena's start
    b = y + 1
    out = torch.ops.aten.as_strided_scatter.default(b.view(-1), a, [2, 8], [8, 1], 0)
    return (out * 3,)


def test_an_op_that_reads_storage_offsets_gets_its_tensors_outside_the_arena():
    inputs = [torch.randn(2, 8), torch.randn(16)]
    compiled = _compile(_scatter_into_a_temporary, inputs)
    assert compiled.program.native is not None
    assert "as_strided_scatter" in str(compiled.schedule), "the op stays an ATen call"
    fresh = [torch.randn(2, 8), torch.randn(16)]
    torch.testing.assert_close(compiled(*fresh)[0], _scatter_into_a_temporary(*fresh)[0])
