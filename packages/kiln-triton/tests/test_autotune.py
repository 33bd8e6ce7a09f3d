"""Launch configurations: candidates by heuristics, winners remembered on disk."""

import pytest
import torch

from kiln_loopir.testing import compile_fn
from kiln_triton import TritonCodegen, autotune
from kiln_triton.configs import Config, candidates


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache for this test, even when the session shares one."""
    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_winner_round_trips_through_the_disk_cache(fresh_cache):
    config = Config("kiln_softmax_looped", (("XBLOCK", 1), ("RBLOCK", 2048)), 8, 1)
    key = autotune.cache_key("abc", {"xnumel": 4, "rnumel": 10000}, (), "H100")
    assert autotune.load_winner(key) is None
    autotune.save_winner(key, config, {"x": 1.0})
    assert autotune.load_winner(key) == config
    assert (fresh_cache / "autotune" / f"{key}.json").exists()
    other = autotune.cache_key("abc", {"xnumel": 8, "rnumel": 10000}, (), "H100")
    assert other != key


@pytest.mark.parametrize(
    "meta, numels",
    [
        ({"kind": "pointwise", "name": "k"}, {"xnumel": 1 << 24}),
        ({"kind": "tiled", "name": "k"}, {"ynumel": 4096, "xnumel": 4096}),
        (
            {"kind": "reduction", "name": "k", "column_major": False},
            {"xnumel": 8192, "rnumel": 768},
        ),
        ({"kind": "reduction", "name": "k", "column_major": True}, {"xnumel": 8192, "rnumel": 768}),
        (
            {"kind": "reduction", "name": "k", "column_major": False},
            {"xnumel": 16, "rnumel": 1 << 20},
        ),
    ],
)
def test_a_small_set_of_candidates(meta, numels):
    configs = candidates(meta, numels)
    assert 1 <= len(configs) <= 8
    assert len(set(configs)) == len(configs)
    for c in configs:
        assert all(b & (b - 1) == 0 for _, b in c.blocks)  # powers of two
        assert c.num_warps in (1, 2, 4, 8, 16, 32)


@pytest.mark.gpu
def test_big_kernels_are_timed_once_then_read_from_disk(fresh_cache):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = torch.randn(4096, 1024, device="cuda")
    graph = compile_fn(lambda a: torch.softmax(a, -1), [x], codegen=TritonCodegen())
    graph(x)
    (kernel,) = [k.fn for k in graph.kernels]
    assert kernel.configs_timed > 1
    again = compile_fn(lambda a: torch.softmax(a, -1), [x], codegen=TritonCodegen())
    torch.testing.assert_close(again(x)[0], torch.softmax(x, -1))
    assert again.kernels[0].fn.configs_timed == 0  # the winner came from disk


def test_a_kernel_with_size_arguments_is_timed_once_per_power_of_two_bucket(
    fresh_cache, monkeypatch
):
    from kiln_loopir.testing import compile_symbolic

    graph = compile_symbolic(
        lambda a: torch.softmax(a, -1), [torch.randn(8, 1000)], codegen=TritonCodegen()
    )
    (kernel,) = [k.fn for k in graph.kernels]
    assert kernel.meta["sizes"], "the softmax takes its sizes as arguments"
    timed: list[int] = []

    def pick(configs, launch_with):  # what timing on a GPU would answer, counted
        timed.append(len(configs))
        return configs[-1], {str(c): float(i) for i, c in enumerate(configs)}

    monkeypatch.setattr(autotune, "pick", pick)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "a GPU")

    def tune(n: int) -> Config:
        sizes = (n,) * len(kernel.meta["sizes"])  # every size n: an n x n softmax
        numels = kernel.numels(sizes)
        configs = candidates(kernel.meta, numels)
        tensors = [torch.empty(n, n) for _ in kernel.meta["args"]]
        return kernel._tune(configs, tensors, sizes, numels, False)

    first = tune(1000)
    assert len(timed) == 1
    assert tune(1020) == first and len(timed) == 1  # the same bucket (1024): not timed
    tune(1100)
    assert len(timed) == 2  # the next bucket (2048) is timed


@pytest.mark.gpu
def test_configs_are_timed_on_the_device_from_a_cuda_graph():
    """A launch is captured once and replayed: its Python runs 1 + 10 times (a warm-up, then
    the capture), its kernel 1 + 3 x 10 times (the warm-up, then three replays)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = torch.zeros(1024, device="cuda")
    calls = []

    def launch():
        calls.append(1)
        x.add_(1)

    assert autotune.time_config(launch, reps=10) > 0
    assert len(calls) == 11 and x[0].item() == 31
