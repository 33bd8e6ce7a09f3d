"""What each rank of the distributed tests runs (``test_distributed.py``): the same model
trained eagerly and through Kiln under DistributedDataParallel or FSDP2, side by side.

Each rank writes what it saw to ``<out>/rank<r>.pt``: per case, the largest difference of
losses and parameters from the eager model, the graphs Kiln compiled, the compiled graphs
that ran in each step, and every "runs eagerly" warning.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln
from kiln.dynamo import kiln_backend

WIDTH = 64
STEPS = 3


class CountingBackend:
    """Kiln's whole stack for each graph, counting the graphs and their runs."""

    def __init__(self) -> None:
        self.graphs = 0
        self.runs = 0

    def __call__(self, gm, example_inputs):
        compiled = kiln_backend(gm, example_inputs)
        self.graphs += 1

        def run(*args):
            self.runs += 1
            return compiled(*args)

        return run


class Blocks(torch.nn.Module):
    """Four Linear+GELU blocks called one by one (no loop), a head, an unused branch."""

    def __init__(self) -> None:
        super().__init__()
        for i in range(4):
            self.add_module(
                f"b{i}", torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
            )
        self.head = torch.nn.Linear(WIDTH, 8)
        self.unused = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        x = self.b3(self.b2(self.b1(self.b0(x))))
        return self.head(x)


def stacked() -> torch.nn.Module:
    """Six Linear+GELU blocks in a Sequential (called in a loop) and a head."""
    layers = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()) for _ in range(6)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 8))


def init(rank: int, world: int, port: int, device: str) -> None:
    """gloo on the CPU, NCCL with one GPU per rank."""
    global DEVICE
    faulthandler.enable()  # a rank that aborts prints where each of its threads was
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
        DEVICE = torch.device("cuda", rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)


DEVICE = torch.device("cpu")


def twins(make):
    """Two copies of one model with the same initial weights, on this rank's device."""
    torch.manual_seed(0)
    a = make().to(DEVICE)
    torch.manual_seed(0)
    return a, make().to(DEVICE)


def batch(rank: int, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * rank + step + int.from_bytes(os.urandom(2)))
    return torch.randn(16, WIDTH, generator=generator).to(DEVICE)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train(eager, compiled, eager_params, compiled_params, rank, syncs=(True,) * STEPS):
    """Steps of SGD on both models; (largest loss and parameter differences, runs per step).
    A step whose ``syncs`` entry is False runs without gradient synchronization
    (``without_gradient_sync``) and accumulates its gradients into the next step's."""
    opt_e = torch.optim.SGD(eager_params, lr=0.1)
    opt_c = torch.optim.SGD(compiled_params, lr=0.1)
    loss_diff, runs = 0.0, []
    for step, sync in enumerate(syncs):
        x = batch(rank, step)
        counted = COUNTER.runs
        for model, opt in ((eager, opt_e), (compiled, opt_c)):
            context = without_gradient_sync(model) if not sync else contextlib.nullcontext()
            with context:
                loss = model(x).square().mean()
                loss.backward()
            if sync:
                opt.step()
                opt.zero_grad(set_to_none=True)
            if model is eager:
                eager_loss = loss.item()
            else:
                loss_diff = max(loss_diff, abs(loss.item() - eager_loss))
        runs.append(COUNTER.runs - counted)
    param_diff = max(
        (full(a) - full(b)).abs().max().item()
        for a, b in zip(eager_params, compiled_params, strict=True)
    )
    return loss_diff, param_diff, runs


@contextlib.contextmanager
def without_gradient_sync(model):
    """DDP's ``no_sync()``; for FSDP2, ``set_requires_gradient_sync(False)``."""
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


COUNTER = CountingBackend()


def run_case(name, build, rank, results, syncs=(True,) * STEPS):
    global COUNTER
    COUNTER = CountingBackend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager, compiled, eager_params, compiled_params = build()
        loss_diff, param_diff, runs = train(
            eager, compiled, eager_params, compiled_params, rank, syncs
        )
    results[name] = {
        "loss_diff": loss_diff,
        "param_diff": param_diff,
        "graphs": COUNTER.graphs,
        "runs": runs,
        "eager_warnings": [str(w.message) for w in caught if "eager" in str(w.message)],
    }


def ddp_cases(rank: int, world: int, port: int, out: str, device: str = "cpu") -> None:
    init(rank, world, port, device)
    results: dict = {}
    cap = 16 * 1024 / 2**20  # 16 KiB buckets: a Linear(64, 64) each

    def outer(**ddp_options):
        def build():
            a, b = twins(stacked)
            eager = DDP(a, bucket_cap_mb=cap, **ddp_options)
            compiled = kiln.compile(DDP(b, bucket_cap_mb=cap, **ddp_options), backend=COUNTER)
            return eager, compiled, list(a.parameters()), list(b.parameters())

        return build

    def inner():
        a, b = twins(stacked)
        eager = DDP(a, bucket_cap_mb=cap)
        compiled = DDP(kiln.compile(b, backend=COUNTER), bucket_cap_mb=cap)
        return eager, compiled, list(a.parameters()), list(b.parameters())

    def unused():
        a, b = twins(Blocks)
        eager = DDP(a, bucket_cap_mb=cap, find_unused_parameters=True)
        compiled = kiln.compile(
            DDP(b, bucket_cap_mb=cap, find_unused_parameters=True), backend=COUNTER
        )
        return eager, compiled, list(a.parameters()), list(b.parameters())

    run_case("compile(DDP(model))", outer(), rank, results)
    run_case("gradient_as_bucket_view", outer(gradient_as_bucket_view=True), rank, results)
    run_case("DDP(compile(model))", inner, rank, results)
    run_case("no_sync", outer(), rank, results, syncs=(False, False, True, True))
    run_case("find_unused_parameters", unused, rank, results)
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def fsdp_cases(rank: int, world: int, port: int, out: str, device: str = "cpu") -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    init(rank, world, port, device)
    mesh = init_device_mesh(device, (world,))
    results: dict = {}

    def sharded(model, blocks, **options):
        for block in blocks(model):
            fully_shard(block, mesh=mesh, **options)
        return fully_shard(model, mesh=mesh, **options)

    def build(make, blocks, **options):
        def build():
            a, b = twins(make)
            eager, compiled = sharded(a, blocks, **options), sharded(b, blocks, **options)
            return (
                eager,
                kiln.compile(compiled, backend=COUNTER),
                list(a.parameters()),
                list(b.parameters()),
            )

        return build

    run_case("blocks", build(Blocks, lambda m: [m.b0, m.b1, m.b2, m.b3]), rank, results)
    run_case("sequential", build(stacked, lambda m: list(m)[:-1]), rank, results)
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = build(Blocks, lambda m: [m.b0, m.b1, m.b2, m.b3], mp_policy=bf16)
    run_case("bf16 parameters", blocks, rank, results)
    blocks = build(Blocks, lambda m: [m.b0, m.b1, m.b2, m.b3])
    run_case("no gradient sync", blocks, rank, results, syncs=(False, False, True, True))
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()
