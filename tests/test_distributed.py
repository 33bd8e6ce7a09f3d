"""kiln.compile under torch.distributed on the CPU (gloo): DistributedDataParallel and FSDP2
models train as the uncompiled ones do, their graphs run compiled at every step, and DDP's
graphs are split at its gradient buckets. Each test spawns its ranks
(``distributed_workers.py`` says what each rank runs)."""

from __future__ import annotations

import pathlib
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# the ranks are new processes: they import the workers by name, from this folder
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import distributed_workers  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker, world: int, tmp_path, monkeypatch, device: str = "cpu") -> list[dict]:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln-cache"))
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "cpp-cache"))
    mp.spawn(worker, args=(world, free_port(), str(tmp_path), device), nprocs=world)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def two_gpus() -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
        reason="needs two CUDA devices and NCCL",
    )


def assert_trained_alike(case: dict, name: str) -> None:
    assert case["loss_diff"] < 1e-5, f"{name}: losses differ from eager's by {case['loss_diff']}"
    assert case["param_diff"] < 1e-5, f"{name}: parameters differ by {case['param_diff']}"


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_trains_as_eager_with_graphs_split_at_buckets(world, tmp_path, monkeypatch):
    check_ddp(spawn(distributed_workers.ddp_cases, world, tmp_path, monkeypatch))


@pytest.mark.gpu
@two_gpus()
def test_ddp_on_two_gpus_with_nccl(tmp_path, monkeypatch):
    check_ddp(spawn(distributed_workers.ddp_cases, 2, tmp_path, monkeypatch, "cuda"))


def check_ddp(ranks: list[dict]) -> None:
    for rank, results in enumerate(ranks):
        for name, case in results.items():
            label = f"rank {rank}, {name}"
            assert_trained_alike(case, label)
            assert not case["eager_warnings"], f"{label}: {case['eager_warnings']}"
            # every compiled graph runs at every step (a step under no_sync too)
            assert case["runs"] == [case["graphs"]] * len(case["runs"]), label
        # six Linear(64, 64) in 16 KiB buckets: at least one graph per two layers
        assert results["compile(DDP(model))"]["graphs"] >= 3
        assert results["DDP(compile(model))"]["graphs"] >= 3
        assert results["find_unused_parameters"]["graphs"] >= 2


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_compiles_each_sharded_module_beneath_its_hooks(world, tmp_path, monkeypatch):
    check_fsdp(spawn(distributed_workers.fsdp_cases, world, tmp_path, monkeypatch))


@pytest.mark.gpu
@two_gpus()
def test_fsdp2_on_two_gpus_with_nccl(tmp_path, monkeypatch):
    check_fsdp(spawn(distributed_workers.fsdp_cases, 2, tmp_path, monkeypatch, "cuda"))


def check_fsdp(ranks: list[dict]) -> None:
    for rank, results in enumerate(ranks):
        # FSDP2's mixed precision in the second; the third's first two steps accumulate
        # gradients without reduce-scattering them (set_requires_gradient_sync(False))
        for name in ("blocks", "bf16 parameters", "no gradient sync"):
            blocks = results[name]
            assert_trained_alike(blocks, f"rank {rank}, {name}")
            assert not blocks["eager_warnings"], blocks["eager_warnings"]
            # the four sharded blocks' forwards and the root's head, at every step
            assert blocks["graphs"] >= 5 and all(r == blocks["graphs"] for r in blocks["runs"])
        sequential = results["sequential"]
        assert_trained_alike(sequential, f"rank {rank}, sequential")
        # six sharded blocks called from Sequential's loop: each block's forward compiled
        assert sequential["graphs"] >= 6 and all(r >= 6 for r in sequential["runs"])
