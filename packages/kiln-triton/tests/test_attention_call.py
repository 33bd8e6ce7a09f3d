"""Which attention nodes Kiln's attention kernel takes, the plain data it is compiled from,
and where the Python host program's launch of it finds each parameter (no device needed:
the kernel itself runs in the GPU tests); on a GPU, that data's binary found again without
Triton's cache key."""

import ctypes

import pytest
import sympy
import torch

from kiln_loopir.ir import Buffer, ExternNode, TensorRef
from kiln_triton.attention import attention_call, forward_launch
from kiln_triton.python_externs import KernelLaunch

FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
CUDA = torch.device("cuda")
QKV_STRIDE = (4 * 100 * 64 * 3, 64, 4 * 64 * 3, 1)  # heads of one [2, 100, 3 * 256] product


def _ints(*values):
    return tuple(sympy.Integer(v) for v in values)


def _head(offset: int) -> TensorRef:
    size = _ints(2, 4, 100, 64)
    return TensorRef("qkv", torch.bfloat16, CUDA, size, _ints(*QKV_STRIDE), sympy.Integer(offset))


def _node(v_offset: int = 512, read_lse: bool = False) -> tuple[ExternNode, set[str]]:
    out = Buffer("out", torch.bfloat16, CUDA, _ints(2, 4, 100, 64), _ints(25600, 64, 256, 1))
    lse = Buffer("lse", torch.float32, CUDA, _ints(2, 4, 100), _ints(400, 100, 1))
    args = (_head(0), _head(256), _head(v_offset), 0.0, True, False)
    return ExternNode(FLASH, args, {}, [out, lse]), {"lse"} if read_lse else set()


def test_a_causal_flash_attention_is_taken_with_its_layouts():
    call = attention_call(*_node())
    assert call is not None and call.causal and call.out.buffer == "out" and call.lse is None
    data = call.compile_args("cuda")
    assert data["kernel"] == "attention_fwd"
    assert data["grid"] == [2, 8, 1]  # blocks of 64 queries, batch x heads
    span = 1 + 76800 + 3 * 64 + 99 * 768 + 63  # one head's elements past its view's start
    buffers = data["buffers"]
    assert [buffers[p][1] for p in ("Q", "K", "V", "Out")] == [span, span + 256, span + 512, 51200]
    assert {buffers[p][0] for p in ("Q", "K", "V", "Out")} == {"bfloat16"}
    assert data["args"]["HEAD_DIM"] == 64 and data["args"]["IS_CAUSAL"]
    assert not data["args"]["HAS_LSE"]


def test_a_read_log_sum_exp_is_written_by_the_kernel():
    call = attention_call(*_node(read_lse=True))  # a training graph's saved result
    assert call is not None and call.lse.buffer == "lse"
    args = call.compile_args("cuda")["args"]
    assert args["HAS_LSE"] and (args["slb"], args["slh"], args["slm"]) == (400, 100, 1)


def test_a_head_wider_than_the_backward_takes_keeps_a_read_log_sum_exp_atens():
    zero = sympy.Integer(0)
    size, stride = _ints(2, 4, 100, 256), _ints(102400, 25600, 256, 1)
    q = TensorRef("q", torch.bfloat16, CUDA, size, stride, zero)
    out = Buffer("out", torch.bfloat16, CUDA, size, stride)
    lse = Buffer("lse", torch.float32, CUDA, _ints(2, 4, 100), _ints(400, 100, 1))
    node = ExternNode(FLASH, (q, q, q, 0.0, True, False), {}, [out, lse])
    assert attention_call(node, set()) is not None  # inference: the output only
    assert attention_call(node, {"lse"}) is None  # its backward would be ATen's


def test_misaligned_views_and_other_read_results_stay_aten_calls():
    assert attention_call(*_node(v_offset=513)) is None  # 1026 bytes past an aligned start
    node, _ = _node()
    node.outputs.append(Buffer("mask", torch.bfloat16, CUDA, _ints(2, 4, 100, 100),
                               _ints(40000, 10000, 100, 1)))  # fmt: skip
    assert attention_call(node, {"mask"}) is None  # a debug mask the kernel does not write


GROUPED = torch.ops.kiln_loopir.grouped_attention.default


def test_grouped_attention_reads_each_key_head_for_its_group_of_query_heads():
    zero = sympy.Integer(0)
    q = TensorRef("q", torch.bfloat16, CUDA, _ints(2, 8, 100, 64), _ints(51200, 64, 512, 1), zero)
    kv_size, kv_stride = _ints(2, 2, 100, 64), _ints(12800, 64, 128, 1)  # [2, 100, 2, 64]
    k = TensorRef("k", torch.bfloat16, CUDA, kv_size, kv_stride, zero)
    v = TensorRef("v", torch.bfloat16, CUDA, kv_size, kv_stride, zero)
    out = Buffer("out", torch.bfloat16, CUDA, _ints(2, 8, 100, 64), _ints(51200, 64, 512, 1))
    node = ExternNode(GROUPED, (q, k, v, None, True, 0.2, [51200, 64, 512, 1]), {}, [out])
    call = attention_call(node, set())
    assert call is not None and call.group == 4 and call.causal and call.scale == 0.2
    args = call.compile_args("cuda")["args"]
    assert args["GROUP"] == 4 and (args["skh"], args["svh"]) == (64, 64)
    uneven = TensorRef("k", torch.bfloat16, CUDA, _ints(2, 3, 100, 64), kv_stride, zero)
    assert attention_call(ExternNode(GROUPED, (q, uneven, v, None, True, 0.2, []), {}, [out]),
                          set()) is None  # fmt: skip


CUDNN_BACKWARD = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
EFFICIENT_BACKWARD = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default


def _grad(name: str, heads: int = 4) -> Buffer:
    return Buffer(name, torch.bfloat16, CUDA, _ints(2, heads, 100, 64),
                  _ints(heads * 6400, 6400, 64, 1))  # fmt: skip


def _backward_node(dropout: float = 0.0, heads: int = 4) -> ExternNode:
    zero = sympy.Integer(0)
    grad_out, out = (_grad(n).ref() for n in ("grad_out", "out"))
    lse = TensorRef("lse", torch.float32, CUDA, _ints(2, 4, 100, 1), _ints(400, 100, 1, 1), zero)
    k = _grad("k", heads).ref()
    seed = TensorRef("seed", torch.int64, CUDA, (), (), zero)
    args = (grad_out, _head(0), k, k, out, lse, seed, seed, None, None, None, 100, 100,
            dropout, True)  # fmt: skip
    outputs = [_grad("dq"), _grad("dk", heads), _grad("dv", heads)]
    return ExternNode(CUDNN_BACKWARD, args, {"scale": 0.2}, outputs)


def test_a_cudnn_attention_backward_is_taken_with_its_layouts():
    from kiln_triton.attention_backward import attention_backward_call

    call = attention_backward_call(_backward_node(), set())
    assert call is not None and call.causal and call.scale == 0.2
    data = call.compile_args("cuda")
    assert data["kernel"] == "attention_bwd"
    assert data["grid"] == [2, 8, 1]  # blocks of 64 queries and keys, batch x heads
    args = data["args"]
    assert (args["sqm"], args["skn"], args["slm"], args["sdkn"]) == (768, 64, 1, 64)
    assert data["buffers"]["DQ"] == ["bfloat16", 51200] and data["buffers"]["LSE"][0] == "float32"


def test_attention_backwards_the_kernel_does_not_cover_stay_aten_calls():
    from kiln_triton.attention_backward import attention_backward_call

    assert attention_backward_call(_backward_node(dropout=0.1), set()) is None
    assert attention_backward_call(_backward_node(heads=2), set()) is None  # grouped keys
    node = _backward_node()
    grad_bias = Buffer("grad_bias", torch.bfloat16, CUDA, _ints(2, 4, 100, 100),
                       _ints(40000, 10000, 100, 1))  # fmt: skip
    a = node.args
    efficient = ExternNode(EFFICIENT_BACKWARD,
                           (a[0], a[1], a[2], a[3], None, a[4], a[5], a[6], a[7], 0.0,
                            [True, True, True, True], True),
                           {}, [*node.outputs, grad_bias])  # fmt: skip
    assert attention_backward_call(efficient, set()) is not None
    assert attention_backward_call(efficient, {"grad_bias"}) is None  # the bias's gradient


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_attention_kernel_compiled_before_is_found_without_triton_s_key(tmp_path, monkeypatch):
    """A warm start compiles its attention kernels again from their records: the second
    compile of the same data reads the binary its first compile remembered."""
    import triton.compiler.compiler as triton_compiler
    from triton.compiler import ASTSource

    from kiln_triton import attention_kernels
    from kiln_triton.attention_kernels import compile_attention

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(tmp_path / "kiln"))
    data = attention_call(*_node(read_lse=True)).compile_args("cuda")
    first, grid = compile_attention(**data)
    assert list((tmp_path / "kiln" / "binaries").glob("*.json"))

    def no_key(*args, **kwargs):
        raise AssertionError("Triton's cache key was computed")

    monkeypatch.setattr(attention_kernels, "_loaded", {})  # as a new process starts
    made: list[str] = []
    make_ir = ASTSource.make_ir
    monkeypatch.setattr(triton_compiler, "get_cache_key", no_key)
    monkeypatch.setattr(
        ASTSource, "make_ir", lambda self, *a, **k: made.append(self.name) or make_ir(self, *a, **k)
    )
    again, again_grid = compile_attention(**data)
    assert made == [] and again is not first and again_grid == grid
    assert again.hash == first.hash and again.asm["cubin"] == first.asm["cubin"]
    assert int(again.function) != 0
    assert again.src.signature == first.src.signature
    assert again.src.constants == first.src.constants


SM90 = ("cuda", 90, 32)


def _compiled_attention_kernels(monkeypatch):
    """Kiln's forward attention kernel as ``triton.jit`` compiles it (the tests run in
    Triton's interpreter otherwise), in place of the one ``attention_kernels`` knows, and
    sm_90 as the current GPU target."""
    import importlib.util

    from kiln_triton import attention_jit, attention_kernels, precompiled

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    spec = importlib.util.spec_from_file_location(
        "kiln_triton.attention_jit", attention_jit.__file__
    )
    compiled = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compiled)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    forward = (compiled.attention_fwd, attention_kernels.KERNELS["attention_fwd"][1])
    monkeypatch.setitem(attention_kernels.KERNELS, "attention_fwd", forward)
    monkeypatch.setattr(precompiled, "current_target", lambda: SM90)
    return attention_kernels


def test_an_attention_job_is_specialized_as_triton_s_launcher_specializes_the_call(
    monkeypatch,
):
    attention_kernels = _compiled_attention_kernels(monkeypatch)
    data = attention_call(*_node(read_lse=True)).compile_args("cuda")
    job = attention_kernels.attention_job("attention_fwd", data["args"], data["buffers"])
    signature, names = job["signature"], attention_kernels.KERNELS["attention_fwd"][0].arg_names
    assert (signature["Q"], signature["LSE"], signature["sm_scale"]) == ("*bf16", "*fp32", "fp32")
    assert job["attrs"][(names.index("Q"),)] == [["tt.divisibility", 16]]  # aligned pointers
    # a stride of 768 is a number divisible by 16; 4 heads are not; a stride of 1 is constant
    assert signature["sqm"] == "i32" and job["attrs"][(names.index("sqm"),)]
    assert signature["H"] == "i32" and job["attrs"][(names.index("H"),)] == []
    assert signature["sqd"] == "constexpr" and job["constexprs"]["sqd"] == 1
    assert job["constexprs"]["HEAD_DIM"] == 64 and job["constexprs"]["IS_CAUSAL"] is True
    warps, stages = forward_launch(64, torch.bfloat16)
    assert job["options"] == {"num_warps": warps, "num_stages": stages} and job["target"] == SM90


def test_an_attention_kernel_handed_ahead_is_built_by_a_worker_and_loaded_here(
    tmp_path, monkeypatch
):
    """A graph's attention kernels go to the compile workers before its kernels are waited
    for; planning the launches then loads the worker's binary without compiling it."""
    from triton.compiler import ASTSource

    from kiln_triton import precompiled
    from kiln_triton.compile_pool import CompileWorkers

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(tmp_path / "kiln"))
    attention_kernels = _compiled_attention_kernels(monkeypatch)
    pool = CompileWorkers(1)
    try:
        monkeypatch.setattr(attention_kernels, "compile_workers", lambda: pool)
        monkeypatch.setattr(attention_kernels, "_compiling", {})
        data = attention_call(*_node()).compile_args("cuda")
        assert attention_kernels.compile_ahead([data, data]) == 1  # one job for both
        job = attention_kernels.attention_job("attention_fwd", data["args"], data["buffers"])
        (future,) = attention_kernels._compiling.values()
        reply = future.result(timeout=600)
        assert reply["error"] is None and reply["pid"] in pool.pids()

        made: list[str] = []
        make_ir = ASTSource.make_ir
        monkeypatch.setattr(
            ASTSource, "make_ir", lambda s, *a, **k: made.append(s.name) or make_ir(s, *a, **k)
        )
        attention_kernels._wait_for_worker(repr(job))
        binary = precompiled.load(attention_kernels.KERNELS["attention_fwd"][0], job)
        assert made == [] and binary.hash == reply["hash"]  # the worker's binary
        assert "cubin" in binary.asm and not attention_kernels._compiling
    finally:
        pool.shutdown()


def test_an_attention_kernel_loads_its_function_without_triton_s_launcher(monkeypatch):
    """Only the native host program launches Kiln's attention kernels, through the handle:
    loading one must not build Triton's launcher for its signature (C code, a compile)."""
    import types

    import triton.runtime

    from kiln_triton.compiled_launch import load_function

    loads = []

    def load_binary(name, kernel, shared, device):
        loads.append((name, kernel, shared, device))
        return ("module", 1234, 32, 0, 1024)

    def no_launcher(*args):
        raise AssertionError("Triton's launcher was made")

    active = types.SimpleNamespace(
        get_current_device=lambda: 0,
        utils=types.SimpleNamespace(load_binary=load_binary),
        launcher_cls=no_launcher,
    )
    monkeypatch.setattr(triton.runtime, "driver", types.SimpleNamespace(active=active))
    compiled = types.SimpleNamespace(
        module=None, function=None, name="attention_fwd", kernel=b"cubin",
        metadata=types.SimpleNamespace(shared=49152),
    )  # fmt: skip
    load_function(compiled)
    assert (compiled.module, compiled.function) == ("module", 1234)
    assert loads == [("attention_fwd", b"cubin", 49152, 0)]
    load_function(compiled)  # loaded once
    assert len(loads) == 1


# -- the Python host program's launch of the kernel (kiln_triton.python_externs) ----------


def _params(call) -> list[tuple[str, object]]:
    """Parameters as the native program plans them: pointers, then numbers, then the null
    scratch pointer newer Triton appends."""
    pointers = [("void*", ref) for ref in call.pointers().values()]
    return pointers + [("int32_t", sympy.Integer(768)), ("float", 0.125), ("void*", None)]


def test_pointers_are_found_among_the_arguments_and_results():
    node, read = _node()
    call = attention_call(node, read)
    launch = KernelLaunch(node, 1234, (2, 8, 1), 128, 0, _params(call))
    kinds = [kind for kind, _ in launch.sources]
    # Q, K, V; no bias: the queries; Out, and Out again for the unread log-sum-exp
    assert launch.sources[:6] == [("input", 0), ("input", 1), ("input", 2), ("input", 0),
                                  ("output", 0), ("output", 0)]  # fmt: skip
    assert kinds[6:] == ["value", "value", "value"]
    assert launch.sources[6][1].value == 768 and isinstance(launch.sources[6][1], ctypes.c_int32)
    assert launch.sources[7][1].value == pytest.approx(0.125)
    assert launch.sources[8][1].value is None  # a null pointer
    size, stride, dtype, device = launch.outputs[0]
    assert (size, stride, dtype) == ((2, 4, 100, 64), (25600, 64, 256, 1), torch.bfloat16)
    assert launch.outputs[1][0] == (2, 4, 100)  # the log-sum-exp, unread: allocated only
    assert launch.inputs == [0, 1, 2, 0]
    assert not launch.bare  # the op returns a tuple: so does the launch


def test_an_op_of_one_result_gets_its_tensor_back_not_a_tuple():
    node, read = _node()
    node = ExternNode(node.target, node.args, {}, node.outputs[:1])  # as grouped_attention
    launch = KernelLaunch(node, 1234, (2, 8, 1), 128, 0, _params(attention_call(node, read)))
    assert launch.bare


def test_a_pointer_into_a_results_middle_is_refused():
    node, read = _node(read_lse=True)
    call = attention_call(node, read)
    params = _params(call)
    lse = call.lse
    past = TensorRef(lse.buffer, lse.dtype, lse.device, lse.size, lse.stride, sympy.Integer(4))
    params[5] = ("void*", past)
    with pytest.raises(ValueError, match="neither an argument nor a result"):
        KernelLaunch(node, 1234, (2, 8, 1), 128, 0, params)
    params[5] = ("void*", _head(0))  # equal to the queries' view, but not the argument
    with pytest.raises(ValueError, match="neither an argument nor a result"):
        KernelLaunch(node, 1234, (2, 8, 1), 128, 0, params)
