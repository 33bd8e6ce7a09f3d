"""Graphs captured under a DistributedDataParallel forward are split at its gradient
buckets (``kiln_capture.distributed``): checked in one process (a gloo group of one rank),
with a backend that records the graphs it is given and runs them as they are."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from recording import Recorder
from torch.nn.parallel import DistributedDataParallel as DDP

from kiln_capture import capture

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def layers(count: int, width: int) -> torch.nn.Sequential:
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(count)
    ]
    return torch.nn.Sequential(*blocks)


def train_step(model, compiled, width: int):
    """One forward and backward of both; the compiled one's output and gradients match."""
    x = torch.randn(4, width)
    expected = model(x)
    expected.square().mean().backward()
    grads = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    actual = compiled(x)
    actual.square().mean().backward()
    torch.testing.assert_close(actual, expected)
    for p, grad in zip(model.parameters(), grads, strict=True):
        if grad is None:  # a frozen parameter
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, grad)


def params_in(gm) -> int:
    sources = [n.meta.get("source", "") for n in gm.graph.find_nodes(op="placeholder")]
    return sum("_parameters" in source for source in sources)


def test_each_graph_holds_about_one_bucket_of_parameters():
    model, backend = layers(6, 256), Recorder()
    # 0.5 MiB buckets (the first one too, as bucket_cap_mb is given): two Linear(256, 256)
    ddp = DDP(model, bucket_cap_mb=0.5)
    train_step(model, capture(ddp, backend), 256)
    assert [params_in(g) for g in backend.graphs] == [4, 4, 4]  # weight and bias, twice


def test_the_last_graph_holds_ddps_smaller_first_bucket():
    model, backend = layers(4, 512), Recorder()
    ddp = DDP(model)  # default: 25 MiB buckets, the first one 1 MiB (one Linear(512, 512))
    train_step(model, capture(ddp, backend), 512)
    assert [params_in(g) for g in backend.graphs] == [6, 2]


def test_ignored_and_frozen_parameters_count_for_no_bucket():
    model, backend = layers(6, 256), Recorder()
    names = [f"{i}.0.weight" for i in range(3)]
    DDP._set_params_and_buffers_to_ignore_for_model(model, names)
    model[5][0].weight.requires_grad_(False)
    ddp = DDP(model, bucket_cap_mb=0.5)
    train_step(model, capture(ddp, backend), 256)
    # counted: layers 3 and 4 (weight and bias), layer 5's bias; the rest in the first graph
    assert len(backend.graphs) == 2


def test_one_graph_outside_ddp_or_without_grad():
    model, backend = layers(6, 256), Recorder()
    captured = capture(model, backend)
    train_step(model, captured, 256)
    assert len(backend.graphs) == 1
    ddp_backend = Recorder()
    ddp = capture(DDP(model, bucket_cap_mb=0.5), ddp_backend)
    with torch.no_grad():
        x = torch.randn(4, 256)
        torch.testing.assert_close(ddp(x), model(x))
    assert len(ddp_backend.graphs) == 1


def test_each_graph_is_compiled_on_the_values_that_reach_it():
    model, seen = layers(6, 256), []

    def backend(gm, example_inputs):
        seen.append(example_inputs)
        return gm.forward

    ddp = DDP(model, bucket_cap_mb=0.5)
    x = torch.randn(4, 256)
    capture(ddp, backend)(x)
    assert len(seen) == 3
    made_before = [t for t in seen[1] if not isinstance(t, torch.nn.Parameter)]
    # the second graph reads the output of the first two layers, as it was at that call
    torch.testing.assert_close(made_before, [model[:2](x)])
