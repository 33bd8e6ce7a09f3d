"""NumPy code on tensors compiles to kernels: kiln-capture traces it as torch ops with
NumPy's semantics, and the frame runs as generated code, not eagerly. ndarrays passed in
are graph inputs too, and ndarrays come out."""

from __future__ import annotations

import warnings

import numpy as np
import torch

import kiln


def numpy_pointwise_and_reduce(x, y):
    a, b = x.numpy(), y.numpy()
    c = np.tanh(a) * np.exp(b) + np.ones(a.shape[1])  # float64, as NumPy does
    return c.sum(axis=1), np.maximum(a, b).mean(axis=0, keepdims=True)


def numpy_between_torch(x):
    a = np.clip(np.sqrt(np.abs(x.relu().numpy())), 0.1, 2.0)
    return torch.from_numpy(a.astype(np.float32)).softmax(-1)


def run_without_fallback(fn, make_inputs, tmp_path):
    compiled = kiln.compile(fn, options={"debug_dir": str(tmp_path), "cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an eager graph fails the test
        for _ in range(2):
            inputs = make_inputs()
            got, expected = compiled(*inputs), fn(*inputs)
            for g, e in zip(
                got if isinstance(got, tuple) else (got,),
                expected if isinstance(expected, tuple) else (expected,),
                strict=True,
            ):
                assert type(g) is type(e) and g.dtype == e.dtype
                # float32 math promoted to float64: float32 rounding
                torch.testing.assert_close(
                    torch.as_tensor(g), torch.as_tensor(e), rtol=1e-5, atol=1e-6
                )
    kernels = list(tmp_path.rglob("forward_kernels.cpp"))
    assert len(kernels) == 1, "the NumPy code is one graph"
    assert 'extern "C"' in kernels[0].read_text()


def test_numpy_functions_and_methods_compile_to_kernels(tmp_path):
    run_without_fallback(
        numpy_pointwise_and_reduce, lambda: (torch.randn(6, 5), torch.randn(6, 5)), tmp_path
    )


def test_numpy_between_torch_ops_compiles_to_kernels(tmp_path):
    run_without_fallback(numpy_between_torch, lambda: (torch.randn(4, 7),), tmp_path)


def numpy_on_ndarray_arguments(a, b):
    return np.tanh(a) * b.sum(axis=0) + 1.5, (a @ b.T).max(axis=1)


def test_ndarray_arguments_compile_to_kernels(tmp_path):
    def make_inputs():
        return np.random.randn(4, 6), np.random.randn(3, 6).astype(np.float32)

    run_without_fallback(numpy_on_ndarray_arguments, make_inputs, tmp_path)


def numpy_sorting_linalg_and_shapes(x, y):
    a, b = x.numpy(), y.numpy()
    s = np.sort(a, axis=1) + np.cumsum(a, axis=0)
    left, _ = np.split(s, 2, axis=1)
    picked = np.take_along_axis(a, np.argmax(a, axis=1)[:, None], axis=1)
    return left * np.linalg.det(b) + np.roll(a, 1, axis=0)[:, :3] + np.median(a) + picked


def test_numpy_sorting_linalg_and_shape_functions_compile(tmp_path):
    run_without_fallback(
        numpy_sorting_linalg_and_shapes,
        lambda: (torch.randn(4, 6), torch.randn(3, 3) + 3 * torch.eye(3)),
        tmp_path,
    )
