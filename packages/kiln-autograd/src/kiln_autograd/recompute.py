"""Which aten ops the min-cut partitioner may recompute in the backward graph.

Cheap, memory-bound ops are recomputable: pointwise ops (``torch.Tag.pointwise``), views,
casts and factories, reductions and normalizations whose inputs the backward has anyway,
gathers and concatenations. Everything else is banned: matmuls, convolutions, attention
(compute-bound), random ops (recomputing them would draw a new mask) and any op this table
does not know.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

# Op names (no namespace, no overload), so that the tables hold across torch versions.
VIEW_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "permute",
    "expand",
    "squeeze",
    "unsqueeze",
    "slice",
    "select",
    "t",
    "transpose",
    "alias",
    "as_strided",
    "split",
    "split_with_sizes",
    "unbind",
    "diagonal",
    "unfold",
}

CHEAP_OPS = {
    # casts, copies and factories
    "_to_copy",
    "clone",
    "full",
    "full_like",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "empty",
    "empty_like",
    "empty_strided",
    "scalar_tensor",
    "arange",
    "iota",
    "lift_fresh_copy",
    # reductions and normalizations
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "var",
    "var_mean",
    "prod",
    "any",
    "all",
    "_softmax",
    "_log_softmax",
    "native_layer_norm",
    # data movement
    "cat",
    "constant_pad_nd",
    "index",
    "index_select",
    "gather",
    "embedding",
    "slice_scatter",
    "select_scatter",
    "where",
    "repeat",
    "scatter",
    "scatter_add",
    "index_put",
    "index_add",
    "flip",
    "roll",
    "cumsum",
}

# Compute-bound ops, named so that the docs and the tests can say what is never recomputed.
COMPUTE_BOUND_OPS = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "convolution_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
}


def is_random(node: torch.fx.Node) -> bool:
    """Whether the node draws random numbers (dropout masks, rand, bernoulli)."""
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags
    )


def is_recomputable(node: torch.fx.Node) -> bool:
    """Whether the backward graph may compute ``node`` again instead of saving it."""
    if node.op == "get_attr":
        return True  # a constant: free in either graph
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return True  # SymInt arithmetic (operator.mul, sym_size ...)
    if is_random(node):
        return False
    name = op_name(target)
    if name in COMPUTE_BOUND_OPS:
        return False
    if name.startswith("sym_"):
        return True
    return torch.Tag.pointwise in target.tags or name in VIEW_OPS or name in CHEAP_OPS


def op_name(target: torch._ops.OpOverload) -> str:
    """The aten op's name without namespace and overload (``aten.view.default`` -> view)."""
    return target._schema.name.split("::")[-1]
