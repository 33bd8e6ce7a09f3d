"""Structured values: dataclasses, NamedTuples and a ModelOutput-like dict subclass."""

import dataclasses
from collections import OrderedDict
from typing import Any, NamedTuple

import torch
from harness import Case, randn


class ModelOutput(OrderedDict):
    """A dict whose set fields are also attributes and positional items.

    Shaped like Hugging Face's ModelOutput: subclasses are dataclasses whose fields default to
    None; fields that are None are left out of the dict and of the tuple view.
    """

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value

    def __getitem__(self, key):
        if isinstance(key, str):
            return dict(self.items())[key]
        return self.to_tuple()[key]

    def __setattr__(self, name, value):
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __getattr__(self, name):
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class CausalOutput(ModelOutput):
    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    hidden: tuple | None = None


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor
    scale: float = 2.0


@dataclasses.dataclass(frozen=True)
class FrozenConfig:
    d: int = 4
    act: str = "relu"
    eps: float = 1e-5


@dataclasses.dataclass
class Nested:
    pair: Pair
    extra: list = dataclasses.field(default_factory=list)


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class Stats(NamedTuple):
    mean: torch.Tensor
    std: torch.Tensor
    n: int = 0


class AttrDict(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def dataclass_input(p):
    return p.a * p.scale + p.b


def dataclass_output(x):
    return Pair(x + 1, x * 2)


def dataclass_replace(p):
    q = dataclasses.replace(p, scale=3.0)
    return q.a * q.scale, q.scale


def dataclass_mutate_input(p, x):
    p.a = p.a + x
    p.scale = 5.0
    return p.b * 2


def dataclass_asdict_fields(p):
    names = [f.name for f in dataclasses.fields(p)]
    return p.a + p.b, names


def frozen_config(x, cfg):
    y = x * cfg.d
    if cfg.act == "relu":
        y = y.relu()
    return y + cfg.eps


def nested_dataclass(n):
    return n.pair.a - n.pair.b + len(n.extra)


def namedtuple_input(p):
    return p.x * p.y, p[0] + p[1]


def namedtuple_output(x):
    return Stats(x.mean(0), x.std(0), x.shape[0])


def namedtuple_unpack(p):
    a, b = p
    return Point(b, a)


def namedtuple_replace(s):
    t = s._replace(n=7)
    return t.mean * t.n, t


def namedtuple_fields(s):
    return s.mean + s.std, s._fields


def model_output_build(x):
    return CausalOutput(logits=x * 2)


def model_output_with_loss(x, y):
    logits = x @ y
    loss = logits.pow(2).mean()
    return CausalOutput(logits=logits, loss=loss)


def model_output_access(out):
    return out.logits * 2, out["logits"] + 1, out[0] - 1, out.loss is None, len(out)


def model_output_keys_iter(out):
    total = 0
    for k in out.keys():  # noqa: SIM118 - calls the keys() method on purpose
        total = total + out[k].sum()
    return total, list(out.keys())


def model_output_to_tuple(out):
    t = out.to_tuple()
    return t[0] + t[1]


def model_output_setitem(x):
    out = CausalOutput(logits=x)
    out["loss"] = x.sum()
    return out


def model_output_hidden_tuple(x):
    hs = tuple(x * i for i in range(3))
    out = CausalOutput(logits=hs[-1], hidden=hs)
    return out.hidden[1] + out.logits


def attr_dict_input(d):
    return d.w * d.x + d["b"]


def attr_dict_output(x):
    return AttrDict(out=x + 1, aux=x.sum())


def attr_dict_get_items(d):
    return {k: v * 2 for k, v in d.items()}


def dict_of_namedtuples(d):
    return d["p"].x + d["q"].y


def list_of_dataclasses(ps):
    return sum(p.a * p.scale for p in ps)


def dataclass_eq(x):
    c1, c2 = FrozenConfig(), FrozenConfig(d=4)
    return x * (c1 == c2)


def namedtuple_as_kwargs(x):
    s = Stats(mean=x, std=x.abs(), n=2)
    return s.mean / (s.std + 1) * s.n


def model_output_in_loop(xs):
    outs = [CausalOutput(logits=x.relu()) for x in xs]
    return torch.stack([o.logits for o in outs])


def typing_any_passthrough(x, meta: Any):
    return x * meta["k"]


CASES = [
    Case("dataclass_input", dataclass_input, lambda: (Pair(torch.randn(3), torch.randn(3)),)),
    Case("dataclass_output", dataclass_output, randn((3,))),
    Case("dataclass_replace", dataclass_replace, lambda: (Pair(torch.randn(3), torch.randn(3)),)),
    Case(
        "dataclass_mutate_input",
        dataclass_mutate_input,
        lambda: (Pair(torch.randn(3), torch.randn(3)), torch.randn(3)),
    ),
    Case(
        "dataclass_fields",
        dataclass_asdict_fields,
        lambda: (Pair(torch.randn(3), torch.randn(3)),),
    ),
    Case("frozen_config", frozen_config, lambda: (torch.randn(3), FrozenConfig())),
    Case(
        "nested_dataclass",
        nested_dataclass,
        lambda: (Nested(Pair(torch.randn(3), torch.randn(3)), [1, 2]),),
    ),
    Case("namedtuple_input", namedtuple_input, lambda: (Point(torch.randn(3), torch.randn(3)),)),
    Case("namedtuple_output", namedtuple_output, randn((4, 3))),
    # Only rebuilds the NamedTuple around the inputs: no tensor op.
    Case(
        "namedtuple_unpack",
        namedtuple_unpack,
        lambda: (Point(torch.randn(3), torch.randn(3)),),
        graphs=0,
    ),
    Case(
        "namedtuple_replace",
        namedtuple_replace,
        lambda: (Stats(torch.randn(3), torch.randn(3), 1),),
    ),
    Case(
        "namedtuple_fields",
        namedtuple_fields,
        lambda: (Stats(torch.randn(3), torch.randn(3), 1),),
    ),
    Case("model_output_build", model_output_build, randn((2, 3))),
    Case("model_output_with_loss", model_output_with_loss, randn((2, 3), (3, 4))),
    Case(
        "model_output_access",
        model_output_access,
        lambda: (CausalOutput(logits=torch.randn(2, 3)),),
    ),
    Case(
        "model_output_keys_iter",
        model_output_keys_iter,
        lambda: (CausalOutput(logits=torch.randn(2, 3), loss=torch.randn(())),),
    ),
    Case(
        "model_output_to_tuple",
        model_output_to_tuple,
        lambda: (CausalOutput(logits=torch.randn(2, 3), loss=torch.randn(())),),
    ),
    Case("model_output_setitem", model_output_setitem, randn((2, 3))),
    Case("model_output_hidden_tuple", model_output_hidden_tuple, randn((2, 3))),
    Case(
        "attr_dict_input",
        attr_dict_input,
        lambda: (AttrDict(w=torch.randn(3), x=torch.randn(3), b=torch.randn(3)),),
    ),
    Case("attr_dict_output", attr_dict_output, randn((3,))),
    Case(
        "attr_dict_items",
        attr_dict_get_items,
        lambda: (AttrDict(a=torch.randn(3), b=torch.randn(3)),),
    ),
    Case(
        "dict_of_namedtuples",
        dict_of_namedtuples,
        lambda: (
            {
                "p": Point(torch.randn(3), torch.randn(3)),
                "q": Point(torch.randn(3), torch.randn(3)),
            },
        ),
    ),
    Case(
        "list_of_dataclasses",
        list_of_dataclasses,
        lambda: ([Pair(torch.randn(3), torch.randn(3), float(i)) for i in range(3)],),
    ),
    Case("dataclass_eq", dataclass_eq, randn((3,))),
    Case("namedtuple_as_kwargs", namedtuple_as_kwargs, randn((3,))),
    Case("model_output_in_loop", model_output_in_loop, lambda: ([torch.randn(3)] * 2,)),
    Case("typing_any_passthrough", typing_any_passthrough, lambda: (torch.randn(3), {"k": 2})),
]
