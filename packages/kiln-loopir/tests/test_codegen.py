"""The codegen protocol and how compile_fx chooses a code generator."""

import pytest
import torch

import kiln_loopir
from kiln_loopir import Codegen, ReferenceCodegen, compile_fx, resolve_codegen
from kiln_loopir import codegen as codegen_module
from kiln_loopir.testing import trace_aten


class CountingCodegen:
    """A codegen wrapping the reference one, to check what compile_fx asks of it."""

    name = "counting"
    device_types = ("cpu",)

    def __init__(self):
        self.inner = ReferenceCodegen()
        self.rendered = []

    def render(self, kernel):
        self.rendered.append(kernel.name)
        return self.inner.render(kernel)

    def compile(self, sources):
        return self.inner.compile(sources)


def test_reference_codegen_implements_the_protocol():
    assert isinstance(ReferenceCodegen(), Codegen)


def test_an_object_is_used_as_given():
    x = torch.randn(3, 4)
    backend = CountingCodegen()
    compiled = compile_fx(trace_aten(lambda x: x.sum(0) + 1, [x]), [x], codegen=backend)
    assert backend.rendered == [k.name for k in compiled.kernels]
    torch.testing.assert_close(compiled(x)[0], x.sum(0) + 1)
    assert compiled.kernels[0].source.startswith("def kiln_fused_sum_add_0(")


def test_missing_codegen_names_the_device_and_what_to_install(monkeypatch):
    monkeypatch.setattr(codegen_module, "codegens", lambda: iter(()))
    with pytest.raises(RuntimeError, match=r"device 'cpu'.*kiln-cpp.*codegen='reference'"):
        resolve_codegen(None, "cpu")
    with pytest.raises(RuntimeError, match="kiln-triton"):
        resolve_codegen(None, "cuda")


def test_discovery_picks_the_codegen_serving_the_device(monkeypatch):
    gpu, cpu = CountingCodegen(), CountingCodegen()
    gpu.device_types = ("cuda",)
    monkeypatch.setattr(codegen_module, "codegens", lambda: iter((("a-gpu", gpu), ("b-cpu", cpu))))
    assert resolve_codegen(None, "cpu") is cpu
    assert resolve_codegen(None, "cuda") is gpu
    assert resolve_codegen("a-gpu", "cpu") is gpu


def test_unknown_names_and_objects_are_refused():
    with pytest.raises(ValueError, match="no code generator named 'nope'"):
        resolve_codegen("nope", "cpu")
    with pytest.raises(TypeError, match="lacks device_types, render or compile"):
        resolve_codegen(object(), "cpu")


def test_entry_points_that_do_not_implement_the_protocol_are_skipped(monkeypatch):
    class EP:
        name, value = "meta-only", "some_module"

        def load(self):
            return object()  # a package with only its metadata so far

    monkeypatch.setattr(codegen_module.metadata, "entry_points", lambda group: [EP()])
    monkeypatch.setattr(codegen_module, "_LOADED", {})
    codegen_module._entry_points.cache_clear()
    try:
        assert codegen_module.installed_codegens() == ()
    finally:
        codegen_module._entry_points.cache_clear()


def test_the_codegen_for_a_device_loads_no_code_generator_after_it(monkeypatch):
    loaded: list[str] = []

    class EP:
        def __init__(self, name, device_types):
            self.name, self.value, self.device_types = name, f"{name}_module", device_types

        def load(self):
            loaded.append(self.name)
            backend = CountingCodegen()
            backend.device_types = self.device_types
            return backend

    eps = [EP("cpp", ("cpu",)), EP("triton", ("cuda",))]
    monkeypatch.setattr(codegen_module.metadata, "entry_points", lambda group: eps)
    monkeypatch.setattr(codegen_module, "_LOADED", {})
    codegen_module._entry_points.cache_clear()
    try:
        assert resolve_codegen(None, "cpu").device_types == ("cpu",)
        assert loaded == ["cpp"]
        assert resolve_codegen(None, "cuda").device_types == ("cuda",)
        assert loaded == ["cpp", "triton"]  # each loaded once
    finally:
        codegen_module._entry_points.cache_clear()


def test_compiled_graph_exposes_every_stage():
    x = torch.randn(3, 4)
    compiled = kiln_loopir.testing.compile_fn(lambda x: (x * 2).softmax(-1), [x])
    assert "Reduction(max" in str(compiled.graph)
    assert "kiln_fused_mul_softmax_0:" in str(compiled.schedule)
    assert "peak" in compiled.memory_plan.format(compiled.schedule)
    assert compiled.host_source.startswith("def call(arg0_1):")
    assert "def check(arg0_1):" in compiled.host_source
    assert "kiln_fused_mul_softmax_0(" in compiled.host_source
    assert "CompiledGraph(1 kernels" in repr(compiled)


def test_wrong_number_of_inputs_is_explained():
    x = torch.randn(3)
    compiled = kiln_loopir.testing.compile_fn(lambda x: x + 1, [x])
    with pytest.raises(TypeError, match=r"takes 1 inputs \(arg0_1\), got 2"):
        compiled(x, x)


def test_input_with_another_layout_is_refused_with_advice():
    x = torch.randn(4, 6)
    compiled = kiln_loopir.testing.compile_fn(lambda x: x + 1, [x])
    with pytest.raises(ValueError, match=r"stride \(1, 4\).*\.contiguous\(\)"):
        compiled(torch.randn(6, 4).t())
    with pytest.raises(ValueError, match="compile again for this shape"):
        compiled(torch.randn(5, 6))


class HostBuildingCodegen(CountingCodegen):
    """A codegen whose native host program is built after its kernels, with work for it
    begun before them (``prepare_host``) and work for the build begun as lowering starts
    (``begin_compile``); it covers no graph (the Python program runs)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def begin_compile(self):
        self.calls.append(("begin_compile",))

    def render(self, kernel):
        self.calls.append(("render",))
        return super().render(kernel)

    def prepare_host(self, schedule):
        self.calls.append(("prepare_host", len(schedule.kernels())))

    def compile(self, sources):
        self.calls.append(("compile", len(sources)))
        return super().compile(sources)

    def build_host(self, schedule, plan, kernels):
        from kiln_loopir.host import HostNotRendered

        self.calls.append(("build_host", len(kernels)))
        raise HostNotRendered("a test's codegen")


@pytest.mark.parametrize("host_program", ["auto", "python"])
def test_work_for_the_native_host_program_begins_before_the_kernels_are_built(host_program):
    x = torch.randn(8, 16)
    gm = trace_aten(lambda t: (t.sin() + 1).sum(1), [x])
    codegen = HostBuildingCodegen()
    compiled = compile_fx(gm, [x], codegen=codegen, host_program=host_program)
    torch.testing.assert_close(compiled(x)[0], (x.sin() + 1).sum(1))
    kernels = len(compiled.schedule.kernels())
    rendered = [("render",)] * kernels
    if host_program == "python":  # no native program: nothing is prepared for one
        assert codegen.calls == [("begin_compile",), *rendered, ("compile", kernels)]
    else:  # the host program's work begins before the kernels render (and build)
        assert codegen.calls == [
            ("begin_compile",), ("prepare_host", kernels), *rendered, ("compile", kernels),
            ("build_host", kernels),
        ]  # fmt: skip


class OwnProductCodegen(CountingCodegen):
    """A codegen whose native host program computes the graph's matrix product with a
    kernel of its own, which it hands the Python program too (``python_externs``); the
    program itself is not built (``program`` None: the Python one runs)."""

    def __init__(self):
        super().__init__()
        self.products = 0

    def own_product(self, a, b):
        self.products += 1
        return torch.mm(a, b)

    def build_host(self, schedule, plan, kernels):
        from types import SimpleNamespace

        from kiln_loopir.ir import ExternNode

        step = next(
            i
            for i, s in enumerate(schedule.steps)
            if isinstance(s, ExternNode) and s.target is torch.ops.aten.mm.default
        )
        return SimpleNamespace(program=None, python_externs={step: ("mm_own", self.own_product)})


def test_an_extern_step_a_codegen_computes_itself_runs_its_kernel_in_the_python_program():
    x, w = torch.randn(64, 256), torch.randn(256, 128)  # a product big enough for ATen's
    gm = trace_aten(lambda x, w: (x.sin() @ w + 1,), [x, w])
    codegen = OwnProductCodegen()
    compiled = compile_fx(gm, [x, w], codegen=codegen)
    assert "mm_own = own_kernel('mm_own', aten.mm.default)" in compiled.host_source
    assert "= mm_own(" in compiled.host_source
    torch.testing.assert_close(compiled(x, w)[0], x.sin() @ w + 1)
    assert codegen.products == 1
    # the same source loaded without that kernel (a cache entry whose native program is
    # not built again) calls the op
    kernels = {k.name: k.fn for k in compiled.kernels}
    program = kiln_loopir.load_host_program(compiled.host_source, kernels, {})
    x = torch.randn(64, 256)
    torch.testing.assert_close(program(x, w)[0], x.sin() @ w + 1)
    assert codegen.products == 1
