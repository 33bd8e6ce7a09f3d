"""torch's own Python functions, which capture steps through: ``torch.functional`` (meshgrid,
broadcast_shapes, unravel_index), ``torch.nn.functional`` (max_unpool2d, unfold) and the
Python they run (``torch.Size`` of a list, ``itertools.accumulate``/``repeat``, ``list[int]``
for ``torch.jit.annotate``, keyword-only parameters after ``*args``)."""

import itertools
import operator

import torch
import torch.nn.functional as F
from harness import Case, randint, randn


def meshgrid_ij(x):
    a, b = torch.meshgrid(x[0], x[1], indexing="ij")
    return a * 2 + b


def meshgrid_xy_list(x):
    a, b = torch.meshgrid([x[0], x[1, :2]], indexing="xy")
    return a - b


def broadcast_shapes_expand(x):
    return x.expand(torch.broadcast_shapes((4, 1), (1, 3))).sin()


def broadcast_shapes_of_shape(x, y):
    return torch.ones(torch.broadcast_shapes(x.shape, y.shape)) * x + y


def unravel_index_argmax(x):
    rows, cols = torch.unravel_index(x.argmax(), x.shape)
    return rows * 10 + cols


def unravel_index_tuple_shape(i):
    return torch.stack(torch.unravel_index(i, (3, 4, 5)))


def size_of_list(x):
    return x.reshape(torch.Size([x.shape[1], x.shape[0]])) + 1


def accumulate_products(x):
    strides = list(itertools.accumulate(reversed(x.shape[1:]), func=operator.mul))
    return x * strides[-1] + sum(itertools.accumulate([1, 2, 3]))


def scaled_all(*ts, scale=None):
    return [t * scale for t in ts]


def keyword_only_after_varargs(x, y):
    a, b = scaled_all(x, y, scale=3.0)
    return a + b


def max_pool_then_unpool(x):
    pooled, indices = F.max_pool2d(x, 2, return_indices=True)
    return F.max_unpool2d(pooled, indices, 2)


def unfold_patches(x):
    return F.unfold(x, (2, 2), stride=2).sum(1)


def repeat_object(x):
    return x * sum(itertools.repeat(2, 3)) + torch.tensor(tuple(itertools.repeat(1.5, 2)))


def annotated_empty_list(x):
    sizes = torch.jit.annotate(list[int], [])
    sizes.append(x.shape[0])
    return x.new_ones(sizes) + x


def tensor_repeat_forms(x):
    return x.repeat((2, 1)) + x.repeat([2, 1]) + x.repeat(torch.Size([2, 1])) + x.repeat(2, 1)


CASES = [
    Case("meshgrid_ij", meshgrid_ij, randn((3, 4))),
    Case("meshgrid_xy_list", meshgrid_xy_list, randn((3, 4))),
    Case("broadcast_shapes_expand", broadcast_shapes_expand, randn((4, 3))),
    Case("broadcast_shapes_of_shape", broadcast_shapes_of_shape, randn((4, 1), (1, 3))),
    Case("unravel_index_argmax", unravel_index_argmax, randn((4, 5))),
    Case("unravel_index_tuple_shape", unravel_index_tuple_shape, randint((6,), low=0, high=60)),
    Case("size_of_list", size_of_list, randn((3, 4))),
    Case("accumulate_products", accumulate_products, randn((2, 3, 4))),
    Case("keyword_only_after_varargs", keyword_only_after_varargs, randn((3,), (3,))),
    Case("max_pool_then_unpool", max_pool_then_unpool, randn((1, 2, 4, 4))),
    Case("unfold_patches", unfold_patches, randn((1, 2, 4, 4))),
    Case("repeat_object", repeat_object, randn((2,))),
    Case("annotated_empty_list", annotated_empty_list, randn((3,))),
    Case("tensor_repeat_forms", tensor_repeat_forms, randn((2, 3))),
]
