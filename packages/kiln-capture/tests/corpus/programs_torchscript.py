"""Code written to be scriptable: TorchScript's helpers (``torch.jit.annotate``,
``torch.jit.isinstance``, ``torch.jit.is_scripting``, ``_overload``, ``boolean_dispatch``),
the ``typing`` forms they name, and the pooling functions built with them, in vision
models such as a ResNet. All of it runs as plain Python eagerly and stays in one graph."""

# typing's List, Optional, Union, as scriptable code spells them:
# ruff: noqa: UP006, UP007, UP035, UP045
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from harness import Case, randn
from torch import nn

torch.manual_seed(4321)


def annotate_typing_forms(x):
    y = x.sin()  # a graph break below would split the graph here
    outs = torch.jit.annotate(List[torch.Tensor], [])
    named = torch.jit.annotate(Dict[str, torch.Tensor], {})
    pair = torch.jit.annotate(Optional[Tuple[int, int]], None)
    scale = torch.jit.annotate(Union[int, float], 2)
    outs.append(y)
    named["y"] = x + 1
    return outs[0] * scale, named, pair


def annotate_builtin_generics(x):
    outs = torch.jit.annotate(list[torch.Tensor], [])
    for i in range(3):
        outs.append(x * i)
    return torch.stack(outs)


def jit_isinstance_checks(x, xs):
    r = x.cos()
    if torch.jit.isinstance(x, torch.Tensor):
        r = r * 3
    if torch.jit.isinstance(xs, List[torch.Tensor]):
        r = r + xs[0]
    if torch.jit.isinstance(xs, Tuple[torch.Tensor, int]):
        r = r - 100
    if not torch.jit.isinstance(3, str):
        r = r - 1
    return r


def scripting_checks(x):
    x = x * 2
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return x
    if torch._C._get_tracing_state() is not None:
        return x * 0
    return x.cos() + 1


def _with_indices(x, k: int, return_indices: bool = False):
    return (x * k).relu(), (x * k).argmax(-1)


def _without_indices(x, k: int, return_indices: bool = False):
    return (x * k).relu()


scaled_relu = torch._jit_internal.boolean_dispatch(
    "return_indices", 2, False, _with_indices, _without_indices, __name__, "scaled_relu"
)


def user_boolean_dispatch(x):
    values, indices = scaled_relu(x, 3, return_indices=True)
    return scaled_relu(x, 2) + values, indices, scaled_relu(x, 4, True)[1]


@torch.jit._overload
def doubled(v: int) -> int: ...


@torch.jit._overload
def doubled(v: torch.Tensor) -> torch.Tensor: ...  # noqa: F811 - an overload


def doubled(v):  # noqa: F811 - the overloads' implementation
    return v * 2


def overloaded_function(x):
    return doubled(x) + doubled(3)


@torch.jit.unused
def _unused_helper(x):
    return x.tan()


@torch.jit.ignore
def _ignored_helper(x):
    return x.exp()


def unused_and_ignored(x):
    return _unused_helper(x) + _ignored_helper(x)


def pooling_functionals(x):
    a = F.max_pool2d(x, 2)
    b, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    c = F.max_pool1d(x.flatten(2), 4)
    d = F.max_pool3d(x.unsqueeze(1), 2)
    e, e_idx = F.adaptive_max_pool2d(x, (3, 2), return_indices=True)
    f = F.adaptive_max_pool1d(x.flatten(2), 5)
    g = F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2)
    return a, b, idx, c, d, e, e_idx, f, g


class BasicBlock(nn.Module):
    """torchvision's ResNet block."""

    def __init__(self, channels: int, stride: int = 1):
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1:
            self.downsample = nn.Sequential(
                nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(8), BasicBlock(8))
        self.layer2 = nn.Sequential(BasicBlock(8, 2), BasicBlock(16))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


RESNET = TinyResNet().eval()
MAX_POOL_INDICES = nn.MaxPool2d(2, return_indices=True)


def list_and_int():
    x, y = torch.randn(3), torch.randn(3)
    return x, [y]


CASES = [
    Case("annotate_typing_forms", annotate_typing_forms, randn((3,))),
    Case("annotate_builtin_generics", annotate_builtin_generics, randn((3,))),
    # torch.compile breaks the graph at each torch.jit.isinstance
    Case("jit_isinstance_checks", jit_isinstance_checks, list_and_int, oracle_graphs=4),
    Case("scripting_checks", scripting_checks, randn((3,))),
    # torch.compile breaks the graph at each call of a boolean_dispatch function of the user's
    Case("user_boolean_dispatch", user_boolean_dispatch, randn((3, 4)), oracle_graphs=4),
    Case("overloaded_function", overloaded_function, randn((3,))),
    Case("unused_and_ignored", unused_and_ignored, randn((3,))),
    Case("pooling_functionals", pooling_functionals, randn((2, 3, 8, 8))),
    Case("max_pool_module_indices", MAX_POOL_INDICES, randn((2, 3, 8, 8))),
    Case("resnet_eval", RESNET, randn((2, 3, 32, 32)), tol={"rtol": 1e-4, "atol": 1e-4}),
]
