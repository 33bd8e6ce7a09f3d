"""nn.Module: attributes, parameters, buffers, submodules, containers, Python-side mutation.

Modules are built once at import under a fixed seed. Those passed as arguments are deep-copied
per run by the harness; those captured directly (`fn=module`) are shared, so cases that mutate
them restore them with `reset`.
"""

import copy

import torch
from harness import Case, randn
from torch import nn

torch.manual_seed(1234)


class MLP(nn.Module):
    def __init__(self, d=4, hidden=8):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class ScaledLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("scale", torch.tensor(0.5))
        self.bias_value = 0.25
        self.use_bias = True

    def forward(self, x):
        y = x @ self.weight * self.scale
        if self.use_bias:
            y = y + self.bias_value
        return y


class Stack(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class IndexedStack(Stack):
    def forward(self, x):
        return self.layers[0](x) + self.layers[-1](x) + len(self.layers)


class EnumeratedStack(Stack):
    def forward(self, x):
        outs = []
        for i, layer in enumerate(self.layers):
            outs.append(layer(x) * i)
        return torch.stack(outs)


class SlicedStack(Stack):
    def forward(self, x):
        for layer in self.layers[1:]:
            x = layer(x)
        return x


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"cls": nn.Linear(4, 2), "reg": nn.Linear(4, 1)})

    def forward(self, x):
        return {name: head(x) for name, head in self.heads.items()}


class HeadsByKey(Heads):
    def forward(self, x, which):
        return self.heads[which](x)


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * self.calls


class Cache(nn.Module):
    def __init__(self):
        super().__init__()
        self.last = None
        self.seen = []

    def forward(self, x):
        y = x.sigmoid()
        self.last = y
        self.seen.append(tuple(x.shape))
        return y * 2


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class Derived(Base):
    def forward(self, x):
        return super().forward(x) * 2 + 1


class DerivedExplicitSuper(Base):
    def forward(self, x):
        return Base.forward(self, x).relu()


class BufferUpdate(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running", torch.zeros(4))
        self.momentum = 0.1

    def forward(self, x):
        self.running.mul_(1 - self.momentum).add_(x.mean(0) * self.momentum)
        return x - self.running


class ParamsIter(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        norm = sum(p.pow(2).sum() for p in self.parameters())
        return self.b(self.a(x)) / norm


class NamedParams(ParamsIter):
    def forward(self, x):
        total = x.sum()
        for name, p in self.named_parameters():
            if name.endswith("weight"):
                total = total + p.sum()
        return total


class TrainingFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y


class WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.drop = nn.Dropout(0.0)
        self.emb = nn.Embedding(10, 4)

    def forward(self, idx):
        return self.drop(self.norm(self.emb(idx)))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x))).flatten(1)


class CallsSubmoduleMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Counterless()

    def forward(self, x):
        return self.inner.project(x) + self.inner.scale


class Counterless(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.scale = 3

    def project(self, x):
        return x * self.w


class AttrFromConfig(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.lin = nn.Linear(cfg["d"], cfg["d"])

    def forward(self, x):
        y = self.lin(x)
        if self.cfg["act"] == "gelu":
            y = nn.functional.gelu(y)
        return y * self.cfg["scale"]


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


class ModuleAsArgCaller(nn.Module):
    def forward(self, x, fn):
        return fn(x) * 2


def call_module_arg(m, x):
    return m(x) + 1


def module_counter_arg(m, x):
    y = m(x)
    m.calls += 10
    return y


def module_set_attr(m, x):
    m.note = "seen"
    m.factor = 3
    return m(x) * m.factor


def module_param_arith(m, x):
    return x @ m.fc1.weight.T + m.fc1.bias


def module_state_dict_keys(m, x):
    keys = list(m.state_dict().keys())
    return m(x), keys


def module_children_count(m, x):
    n = len(list(m.children()))
    return m(x) * n


def module_walk_modules(m, x):
    # as nn.TransformerEncoderLayer's fast-path check does: `for m in self.modules()`
    linears = sum(1 for sub in m.modules() if isinstance(sub, torch.nn.Linear))
    names = [name for name, _ in m.named_modules()]
    return m(x) * linears, names


def module_eval_flag(m, x):
    return m(x), m.training


def module_apply_twice(m, x):
    return m(m(x))


def seq_index(seq, x):
    return x * len(seq) + seq[-1](seq[1](seq[0](x)))


def freeze_reset(module):
    snapshot = copy.deepcopy(module.state_dict())
    attrs = {k: copy.copy(v) for k, v in vars(module).items() if not k.startswith("_")}

    def reset():
        module.load_state_dict(snapshot)
        for k, v in attrs.items():
            setattr(module, k, copy.copy(v))

    return reset


def module_state(module):
    def state():
        return (
            {k: v.clone() for k, v in module.state_dict().items()},
            {k: v for k, v in vars(module).items() if not k.startswith("_")},
        )

    return state


MLP_M = MLP()
SCALED = ScaledLinear()
STACK = Stack()
IDX = IndexedStack()
ENUM = EnumeratedStack()
SLICED = SlicedStack()
HEADS = Heads()
HEADS_KEY = HeadsByKey()
COUNTER = Counter()
CACHE = Cache()
DERIVED = Derived()
DERIVED2 = DerivedExplicitSuper()
BUFFER = BufferUpdate()
PARAMS = ParamsIter()
NAMED = NamedParams()
TRAIN = TrainingFlag()
EVAL = TrainingFlag().eval()
NORM = WithNorm()
CONV = ConvNet()
SUBMETHOD = CallsSubmoduleMethod()
CFG = AttrFromConfig({"d": 4, "act": "gelu", "scale": 0.5})
RESID = Residual(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))
SEQ = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
ARGCALLER = ModuleAsArgCaller()


def _mut(module):
    return {"reset": freeze_reset(module), "state": module_state(module)}


def loss_module_built_inside(logits, labels):
    loss_fct = torch.nn.CrossEntropyLoss(ignore_index=1)
    act = torch.nn.GELU(approximate="tanh")
    return loss_fct(act(logits).view(-1, 5), labels.view(-1))


def loss_module_returned(x):
    loss = torch.nn.MSELoss(reduction="sum")
    return loss(x, x.flip(0)), loss


def linear_built_inside(x):
    return torch.nn.Linear(4, 4)(x).shape


def broadcast_tensors_pair(x):
    a, b = torch.broadcast_tensors(x, x[:1].flip(1))
    return a * b


CASES = [
    Case("mlp", MLP_M, randn((2, 4))),
    Case("parameter_buffer_attr", SCALED, randn((2, 4))),
    Case("module_list_iteration", STACK, randn((2, 4))),
    Case("module_list_indexing", IDX, randn((2, 4))),
    Case("module_list_enumerate", ENUM, randn((2, 4))),
    Case("module_list_slice", SLICED, randn((2, 4))),
    Case("module_dict_items", HEADS, randn((2, 4))),
    Case("module_dict_key", HEADS_KEY, lambda: (torch.randn(2, 4), "reg")),
    Case("sequential", SEQ, randn((2, 4))),
    Case("sequential_index", seq_index, lambda: (SEQ, torch.randn(2, 4))),
    Case("self_calls_counter", COUNTER, randn((2, 4)), **_mut(COUNTER)),
    Case("self_attr_tensor_and_list", CACHE, randn((2, 4)), **_mut(CACHE)),
    Case("super_forward", DERIVED, randn((2, 4))),
    Case("explicit_base_forward", DERIVED2, randn((2, 4))),
    Case("buffer_inplace_update", BUFFER, randn((5, 4)), **_mut(BUFFER)),
    Case("parameters_iteration", PARAMS, randn((2, 4))),
    Case("named_parameters", NAMED, randn((2, 4))),
    Case("training_flag_train", TRAIN, randn((2, 4))),
    Case("training_flag_eval", EVAL, randn((2, 4))),
    Case("norm_dropout_embedding", NORM, lambda: (torch.randint(0, 10, (2, 3)),)),
    Case("conv_pool", CONV, randn((2, 2, 5, 5)), tol={"atol": 1e-5, "rtol": 1e-4}),
    Case("submodule_method", SUBMETHOD, randn((2, 4))),
    Case("config_dict_attr", CFG, randn((2, 4))),
    Case("residual_wrapper", RESID, randn((2, 4))),
    Case("module_and_function_arg", ARGCALLER, lambda: (torch.randn(3), torch.sigmoid)),
    Case("module_as_argument", call_module_arg, lambda: (MLP(), torch.randn(2, 4))),
    Case("module_arg_counter", module_counter_arg, lambda: (Counter(), torch.randn(2, 4))),
    Case("module_arg_set_attr", module_set_attr, lambda: (Base(), torch.randn(2, 4))),
    Case("module_param_arith", module_param_arith, lambda: (MLP(), torch.randn(2, 4))),
    Case("module_state_dict_keys", module_state_dict_keys, lambda: (Base(), torch.randn(2, 4))),
    Case("module_children_count", module_children_count, lambda: (MLP(), torch.randn(2, 4))),
    Case("module_walk_modules", module_walk_modules, lambda: (MLP(), torch.randn(2, 4))),
    Case("module_eval_flag", module_eval_flag, lambda: (Base().eval(), torch.randn(2, 4))),
    Case("module_apply_twice", module_apply_twice, lambda: (Base(), torch.randn(2, 4))),
    Case(
        "loss_module_built_inside",
        loss_module_built_inside,
        lambda: (torch.randn(3, 5), torch.randint(0, 5, (3,))),
    ),
    Case("broadcast_tensors_pair", broadcast_tensors_pair, randn((3, 4))),
    Case("loss_module_returned", loss_module_returned, randn((3, 4))),
    Case("module_with_parameters_built_inside", linear_built_inside, randn((2, 4))),
    Case(
        "module_arg_buffer_update",
        call_module_arg,
        lambda: (BufferUpdate(), torch.randn(3, 4)),
    ),
]
