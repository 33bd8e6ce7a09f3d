"""NumPy on tensors: `t.numpy()`, `np.*` functions, ndarray methods, attributes and operators
are captured as torch ops with NumPy's semantics; ndarrays come back as real ndarrays.
ndarrays passed in are graph inputs over their memory, as tensors are."""

import numpy as np
import torch
from harness import Case, randn


def numpy_roundtrip(x):
    a = x.numpy()
    return torch.from_numpy(np.sin(a) * 2 + 1)


def returns_ndarray(x):
    return np.exp(x.numpy()) - 1


def float64_default(x):
    return x.numpy() + np.ones(3)  # np.ones is float64: the sum is float64


def unary_functions(x):
    a = np.abs(x.numpy()) + 0.5
    return np.cos(a) + np.tanh(a) + np.sqrt(a) + np.log(a) + np.exp2(a) + np.square(a)


def binary_functions(x, y):
    a, b = x.numpy(), y.numpy()
    return np.add(a, b), np.multiply(a, b), np.maximum(a, b), np.minimum(a, 0.0), np.subtract(b, a)


def reductions_with_axis(x):
    a = x.numpy()
    return (
        np.sum(a, axis=1),
        np.mean(a, axis=0, keepdims=True),
        np.max(a, axis=-1),
        np.min(a),
        np.argmax(a, axis=1),
    )


def scalar_results(x):
    a = x.numpy()
    return a.sum(), a.mean(), np.max(a), a[0, 1]  # NumPy scalars, not 0-d arrays


def ndarray_methods(x):
    a = x.numpy()
    return a.sum(axis=0), a.mean(axis=1), a.T, a.reshape(2, -1), a.astype(np.float64), a.max(0)


def shape_attributes(x):
    a = x.numpy()
    return a.shape, a.ndim, a.size, a.dtype, len(a), a * a.shape[1]


def operators(x, y):
    a, b = x.numpy(), y.numpy()
    return a + b, a - 1, 2 * a, a / (abs(b) + 1), a @ b.T, -a, a**2, a > b, a // 1.5


def indexing(x):
    a = x.numpy()
    return a[0], a[:, 1], a[1:, ::2], a[None, 0], a[..., -1]


def matmul_dot_where_clip(x, y):
    a, b = x.numpy(), y.numpy()
    m = np.matmul(a, b.T)
    return np.dot(a[0], b[0]), np.where(m > 0, m, 0.0), np.clip(m, -0.5, 0.5)


def join_and_reshape(x, y):
    a, b = x.numpy(), y.numpy()
    c = np.concatenate([a, b], axis=0)
    s = np.stack((a, b), axis=1)
    return c, s, np.transpose(s, (2, 0, 1)), np.reshape(c, (-1,)), np.mean(c)


def astype_copies(x):
    a = x.numpy()
    b = a.astype(np.float32)  # a copy, as NumPy makes: not the input's memory
    return b


def as_tensor_back(x):
    a = np.tanh(x.numpy())
    return torch.as_tensor(a) * x, torch.as_tensor(a, dtype=torch.float64)


def numpy_then_torch(x):
    y = torch.relu(x) + 1
    a = np.log(y.numpy())
    return torch.from_numpy(a).softmax(-1)


def numpy_helper(a):
    return np.sqrt(np.abs(a)) * np.sign(a)


def numpy_in_helper(x):
    return torch.from_numpy(numpy_helper(x.numpy())) + x


def print_between(x):
    a = np.sin(x.numpy())
    print("between")
    return np.cos(a)


def in_place_on_ndarray(x):
    a = np.exp(x.numpy())
    a += 1  # writes the array's memory: the graph breaks here
    return a


def in_place_writes_the_tensor(x):
    a = x.numpy()
    a += 1  # x's memory: eagerly x changes too
    return x * 2


def numpy_of_requires_grad(x):
    return (x * 2).detach().numpy().sum(axis=0)


def untraced_numpy_function(x):
    return np.sort(np.sin(x.numpy()))  # np.sort is not traced: the graph breaks there


def ndarray_arguments(a, b):
    return np.sin(a) * b + 1, (a @ b.T).sum(axis=1), a.shape


def ndarray_argument_returned(a):
    return a, a.mean(), a.T


def ndarray_with_tensor(a, x):
    return torch.from_numpy(a) * x + 1


def ndarrays_in_a_list(arrays):
    return np.stack(arrays).sum(axis=0) * 2


def ndarray_argument_in_place(a):
    a += 1  # writes the caller's array: the graph breaks here
    return a * 2


def ndarrays(*shapes, dtype=torch.float32):
    return lambda: tuple(torch.randn(s, dtype=dtype).numpy() for s in shapes)


CASES = [
    Case("numpy_roundtrip", numpy_roundtrip, randn((3, 4))),
    Case("numpy_returns_ndarray", returns_ndarray, randn((5,))),
    Case("numpy_float64_default", float64_default, randn((2, 3))),
    Case("numpy_unary_functions", unary_functions, randn((4, 3))),
    Case("numpy_binary_functions", binary_functions, randn((3, 4), (3, 4))),
    Case("numpy_reductions_with_axis", reductions_with_axis, randn((3, 5))),
    Case("numpy_scalar_results", scalar_results, randn((3, 4))),
    Case("numpy_ndarray_methods", ndarray_methods, randn((4, 6))),
    Case("numpy_shape_attributes", shape_attributes, randn((3, 4))),
    Case("numpy_operators", operators, randn((3, 4), (3, 4))),
    Case("numpy_indexing", indexing, randn((3, 4))),
    Case("numpy_matmul_dot_where_clip", matmul_dot_where_clip, randn((3, 4), (5, 4))),
    Case("numpy_join_and_reshape", join_and_reshape, randn((2, 3), (2, 3))),
    Case("numpy_astype_copies", astype_copies, randn((3,))),
    Case("numpy_as_tensor_back", as_tensor_back, randn((2, 3))),
    Case("numpy_then_torch", numpy_then_torch, randn((2, 5))),
    Case("numpy_in_helper", numpy_in_helper, randn((4,))),
    # the resume function gets `a` as an ndarray argument: traced again
    Case("numpy_print_between", print_between, randn((3,)), graphs=2),
    Case("numpy_in_place_on_ndarray", in_place_on_ndarray, randn((3,)), graphs=1),
    Case("numpy_in_place_writes_the_tensor", in_place_writes_the_tensor, randn((3,))),
    Case("numpy_of_detached", numpy_of_requires_grad, randn((2, 3), requires_grad=True)),
    Case("numpy_untraced_function", untraced_numpy_function, randn((4,))),
    Case("numpy_ndarray_arguments", ndarray_arguments, ndarrays((3, 4), (3, 4))),
    Case(
        "numpy_ndarray_float64_returned",
        ndarray_argument_returned,
        ndarrays((2, 3), dtype=torch.float64),
        oracle_xfail="torch.compile gives a.mean() as a 0-d ndarray, NumPy as a float64",
    ),
    Case(
        "numpy_ndarray_with_tensor",
        ndarray_with_tensor,
        lambda: (torch.randn(3).numpy(), torch.randn(3)),
    ),
    Case(
        "numpy_ndarrays_in_a_list",
        ndarrays_in_a_list,
        lambda: ([torch.randn(4).numpy() for _ in range(3)],),
    ),
    Case("numpy_ndarray_argument_in_place", ndarray_argument_in_place, ndarrays((3,))),
]
