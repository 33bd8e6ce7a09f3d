"""Fake results of a torch call seen before in the same capture, made from its metadata.

A model's repeated layers make the same torch calls on tensors of the same sizes. After
the first, the fake run of a call is answered from what the first run returned, where that
was an argument as it is (dropout in eval mode), a new tensor, or a view of a new tensor
(``F.linear`` over three dimensions), the run changed no argument, and no size anywhere is
symbolic: a fresh fake tensor of the same size, stride, dtype and device is made as torch's
own fake-tensor cache makes one for an aten op. That cache answers once per aten op and
computes a costly key for each; one ``F.linear`` is eight of them, so without this the fake
runs of a 12-layer model cost most of its capture.

The key is the call (kind, target) with each argument's metadata (a fake tensor's size,
stride, storage offset, dtype, device, ``requires_grad``, conjugate and negative bits) or
value (a constant), and the state that can change a result (grad mode, the default dtype
and device). A call with anything else among its arguments (a symbolic size, an object, an
inference tensor, a fake tensor that holds its data), or made under autocast or inference
mode, always runs. A result that requires grad gets autograd history of its own (the clone
of a leaf; its ``_base`` where the first run's had one), so it is no leaf, as the first
run's was not.
"""

from __future__ import annotations

import torch
from torch._prims_common import compute_required_storage_length, make_contiguous_strides_for
from torch._subclasses.fake_tensor import FakeTensor

CONSTANT_TYPES = (
    int,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.memory_format,
    torch.layout,
)


class Unkeyable(Exception):
    """An argument the key cannot describe: the call runs."""


class FakeMemo:
    def __init__(self, fake_mode):
        self.fake_mode = fake_mode
        # key -> (size, stride, dtype, device) of the first run's result
        self.results: dict[tuple, tuple] = {}

    def key(self, kind: str, target, args: tuple, kwargs: dict) -> tuple | None:
        """The call's key, or None where it must run (see the module docstring; a symbolic
        size is not hashable)."""
        if torch._C._is_any_autocast_enabled() or torch.is_inference_mode_enabled():
            return None
        try:
            key = (
                kind,
                target,
                torch.is_grad_enabled(),
                torch.get_default_dtype(),
                torch.get_default_device(),
                tuple(_describe(a) for a in args),
                tuple((name, _describe(v)) for name, v in kwargs.items()),
            )
            hash(key)
        except (Unkeyable, TypeError):
            return None
        return key

    def recall(self, key: tuple | None, tensors: list):
        """The result of the call ``key`` names (its argument ``tensors`` flattened), made
        from the first run's, if there was one."""
        found = self.results.get(key) if key is not None else None
        if found is None:
            return None
        kind, *made = found
        if kind == "argument":  # the call returns an argument as it is (dropout in eval)
            return tensors[made[0]]
        if kind == "new":
            return self.new_tensor(*made)
        base, size, stride, offset = made  # a view of a new tensor (F.linear's over 3 dims)
        base = self.new_tensor(*base)  # made outside the fake mode, as a meta tensor
        with self.fake_mode:  # the view through autograd's view tracking: its _base is set
            return torch.as_strided(base, size, stride, offset)

    def new_tensor(self, size, stride, dtype, device, requires_grad) -> FakeTensor:
        empty = torch.empty_strided(size, stride, dtype=dtype, device="meta")
        made = FakeTensor(self.fake_mode, empty, device)
        if not requires_grad:
            return made
        # autograd history of its own (a leaf's clone): no leaf, so in-place ops on it run
        made.requires_grad_()
        with self.fake_mode:
            return made.clone()

    def remember(self, key: tuple | None, result, tensors: list, before: list) -> None:
        """Keep what ``result``, the first run of ``key``, is made of, where the run changed
        none of the argument ``tensors`` (``before``: :func:`states` before the run) and the
        result is an argument, a new tensor, or a view of a new tensor."""
        if key is None or states(tensors) != before:
            return  # an argument was written to, or changed: every run must do that
        if any(result is t for t in tensors):
            self.results[key] = ("argument", next(i for i, t in enumerate(tensors) if t is result))
            return
        if not isinstance(result, FakeTensor) or not _is_plain(result, self.fake_mode):
            return
        storage = result.untyped_storage()._cdata
        if any(t.untyped_storage()._cdata == storage for t in tensors):
            return
        base = result._base
        if base is None and _is_new(result) and _history_remade(result):
            self.results[key] = ("new", *_metadata(result))
        elif (
            base is not None
            and base._base is None
            and _is_plain(base, self.fake_mode)
            and _is_new(base)
            and _history_remade(base)
            and base.untyped_storage()._cdata == storage
        ):
            size, stride, offset = tuple(result.shape), result.stride(), result.storage_offset()
            self.results[key] = ("view", _metadata(base), size, stride, offset)


def states(tensors: list) -> list:
    """What a call could change of its argument tensors: metadata and version counters."""
    return [(_describe(t), t._version) for t in tensors]


def tensor_arguments(args: tuple, kwargs: dict) -> list:
    """The fake tensors among a call's arguments (in lists and tuples too)."""
    found: list = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found += tensor_arguments(tuple(value), {})
    return found


def _describe(value):
    if isinstance(value, torch.Tensor):
        if (
            type(value) is not FakeTensor
            or value.layout is not torch.strided
            or value.is_inference()  # no version counter to tell a write by
            or value.constant is not None  # its data can decide a result's size
        ):
            raise Unkeyable
        return (
            FakeTensor,
            tuple(value.shape),
            value.stride(),
            value.storage_offset(),
            value.dtype,
            value.device,
            value.requires_grad,
            value.is_conj(),
            value.is_neg(),
        )
    if type(value) is float:  # by its text: 0.0 and -0.0 are equal as numbers
        return (float, repr(value))
    if type(value) in CONSTANT_TYPES:
        return (type(value), value)
    if type(value) in (tuple, list, torch.Size):
        return (type(value), tuple(_describe(v) for v in value))
    raise Unkeyable


def _metadata(t) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad


def _history_remade(t) -> bool:
    """Whether :meth:`FakeMemo.new_tensor` makes ``t`` again with the strides it has: a
    tensor that requires grad is made by a clone, which keeps contiguous strides only."""
    return not t.requires_grad or t.stride() == tuple(make_contiguous_strides_for(t.shape))


def _is_plain(t, fake_mode) -> bool:
    """A fake tensor of this capture with nothing but size, stride and dtype to make again."""
    return (
        type(t) is FakeTensor
        and t.fake_mode is fake_mode
        and (not t.requires_grad or t.grad_fn is not None)  # a leaf is made by a factory
        and getattr(t, "constant", None) is None
        and t.layout is torch.strided
        and not t.is_conj()
        and not t.is_neg()
        and not t.is_inference()
        and all(type(n) is int for n in (*t.shape, *t.stride(), t.storage_offset()))
    )


def _is_new(t) -> bool:
    """Of its own storage, as ``torch.empty_strided`` makes one."""
    shape, stride = tuple(t.shape), t.stride()
    needed = compute_required_storage_length(shape, stride, 0) * t.element_size()
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == needed
