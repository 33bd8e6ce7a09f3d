"""Models and checks the tests share."""

import json
import os
import subprocess
import sys

import torch


def run_in_new_process(script: str, tmp_path) -> dict:
    """``script`` run by a fresh interpreter (this one's path, kiln-cpp's cache under
    ``tmp_path``): the JSON object its last line prints, and what it wrote to stderr."""
    env = {
        **os.environ,
        "KILN_CPP_CACHE_DIR": str(tmp_path / "cpp-cache"),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


class Block(torch.nn.Module):
    """LayerNorm, an MLP with GELU, a residual and a softmax; one Linear left unused."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)
        self.unused = torch.nn.Linear(width, width)  # gets no gradient, eagerly or compiled

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return (x + h).softmax(-1)


def copy_of(model: torch.nn.Module) -> torch.nn.Module:
    clone = type(model)()
    clone.load_state_dict(model.state_dict())
    return clone.train(model.training)


def assert_same_grads(model, reference):
    """Every parameter has a gradient exactly where eager gives one, and it is eager's."""
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        if p_ref.grad is None:
            assert p.grad is None, f"{name} got a gradient eager does not give"
        else:
            assert p.grad is not None, f"{name} got no gradient, eager gives one"
            torch.testing.assert_close(p.grad, p_ref.grad, msg=name)


def symbolic(values) -> bool:
    """Whether any tensor of ``values`` has a symbolic size or stride."""
    return any(
        isinstance(s, torch.SymInt)
        for v in values
        if isinstance(v, torch.Tensor)
        for s in (*v.shape, *v.stride())
    )
