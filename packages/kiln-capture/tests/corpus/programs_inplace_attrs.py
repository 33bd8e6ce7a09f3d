"""In-place tensor ops on inputs and intermediates; tensor attributes as Python values."""

import torch
from harness import Case, randint, randn


def add_inplace_input(x, y):
    x.add_(y)
    return x * 2


def mul_inplace_intermediate(x):
    y = x + 1
    y.mul_(3)
    return y


def copy_into_input(x, y):
    x.copy_(y * 2)
    return None


def index_assign_scalar(x):
    x[0] = 1
    return x.sum()


def index_assign_column_add(x, y):
    x[:, 1] += y
    return x


def index_assign_intermediate(x):
    y = x.clone()
    y[1:, :2] = 0.5
    y[0] = y[0] * 2
    return y


def bool_mask_assign(x):
    y = x.clone()
    y[y < 0] = 0
    return y


def inplace_chain(x):
    return x.clone().mul_(2).add_(1).clamp_(-1, 1)


def inplace_view(x):
    v = x.view(-1)
    v[0] = 10.0
    return x + 0


def inplace_on_view_of_input(x):
    x[0].zero_()
    x[1].fill_(2.0)
    return x.sum(0)


def augmented_assign_tensor(x, y):
    z = x * 1
    z += y
    z *= 2
    z -= 1
    z /= 4
    return z


def augmented_assign_input(x, y):
    x += y
    return x


def inplace_unary(x):
    y = x.clone()
    y.relu_()
    y.exp_()
    y.sqrt_()
    return y


def index_put_(x):
    idx = torch.tensor([0, 2])
    x.index_put_((idx,), torch.tensor(7.0))
    return x


def scatter_inplace(x):
    out = torch.zeros(3, 4)
    out.scatter_(1, torch.tensor([[0], [1], [2]]), x[:, :1])
    return out


def masked_fill_inplace(x):
    x.masked_fill_(x > 1, 1.0)
    return x


def shape_attrs(x):
    return x.shape, x.shape[0], x.size(), x.size(1), x.dim(), x.ndim, x.numel()


def shape_used_in_ops(x):
    b, n = x.shape
    return x.reshape(n, b) * b + n


def dtype_device_attrs(x):
    return x.dtype, x.device, x.is_floating_point(), x.dtype == torch.float32


def dtype_used_in_ops(x):
    return torch.zeros(2, dtype=x.dtype, device=x.device) + 1, x.to(x.dtype) + 1


def int_dtype_attrs(a):
    return a.dtype, a.is_floating_point(), a.float().is_floating_point()


def transpose_attr(x):
    return x.T @ x, x.mT.shape


def new_tensor_from_shape(x):
    return x.new_ones(x.shape[-1]) * 3 + x.new_zeros(x.shape[-1]), x.new_full((2,), 1.5)


def numel_arith(x):
    return x.sum() / x.numel(), x.element_size()


def size_negative_index(x):
    return x.view(x.size(0), -1) * x.size(-1)


def shape_comparison_branch(x):
    if x.shape[0] > 2 and x.dim() == 2:
        return x.sum(0)
    return x.sum(1)


def stride_contiguous(x):
    y = x.t()
    return y.contiguous(), y.is_contiguous(), x.stride()


def inplace_intermediate_then_reuse(x):
    y = x.exp()
    z = y * 2
    y.add_(1)
    return y, z


def inplace_on_input_and_return_alias(x):
    y = x.mul_(2)
    return y is x, y


def setitem_with_tensor_index(x, i):
    x[i] = -1.0
    return x


def zero_grad_like(x):
    y = x.clone()
    y.zero_()
    return y + 1


def clamp_inplace_bounds_from_shape(x):
    x.clamp_(min=-x.shape[0], max=x.shape[1] / 10)
    return x


def requires_grad_attribute_inplace(x):
    y = x.detach().clone()
    y.requires_grad_(True)
    return y * 2


def unsqueeze_inplace(x):
    y = x.clone()
    y.unsqueeze_(0)
    y.squeeze_(0)
    y.t_()
    return y


def item_free_len(x):
    return x * len(x), len(x.shape)


CASES = [
    Case("add_inplace_input", add_inplace_input, randn((3, 4), (3, 4))),
    Case("mul_inplace_intermediate", mul_inplace_intermediate, randn((3, 4))),
    Case("copy_into_input", copy_into_input, randn((3, 4), (3, 4))),
    Case("index_assign_scalar", index_assign_scalar, randn((3, 4))),
    Case("index_assign_column_add", index_assign_column_add, randn((3, 4), (3,))),
    Case("index_assign_intermediate", index_assign_intermediate, randn((3, 4))),
    Case("bool_mask_assign", bool_mask_assign, randn((3, 4))),
    Case("inplace_chain", inplace_chain, randn((3, 4))),
    Case("inplace_view", inplace_view, randn((3, 4))),
    Case("inplace_on_view_of_input", inplace_on_view_of_input, randn((3, 4))),
    Case("augmented_assign_tensor", augmented_assign_tensor, randn((3, 4), (3, 4))),
    Case("augmented_assign_input", augmented_assign_input, randn((3, 4), (3, 4))),
    Case("inplace_unary", inplace_unary, randn((3, 4))),
    Case("index_put_", index_put_, randn((3, 4))),
    Case("scatter_inplace", scatter_inplace, randn((3, 4))),
    Case("masked_fill_inplace", masked_fill_inplace, randn((3, 4))),
    # Only reads static shape attributes: no tensor op.
    Case("shape_attrs", shape_attrs, randn((3, 4)), graphs=0),
    Case("shape_used_in_ops", shape_used_in_ops, randn((3, 4))),
    Case("dtype_device_attrs", dtype_device_attrs, randn((3, 4)), graphs=0),
    Case("dtype_used_in_ops", dtype_used_in_ops, randn((3, 4))),
    Case("int_dtype_attrs", int_dtype_attrs, randint((3, 4))),
    Case("transpose_attr", transpose_attr, randn((3, 4))),
    Case("new_tensor_from_shape", new_tensor_from_shape, randn((3, 4))),
    Case("numel_arith", numel_arith, randn((3, 4))),
    Case("size_negative_index", size_negative_index, randn((3, 2, 2))),
    Case("shape_comparison_branch", shape_comparison_branch, randn((3, 4))),
    Case("stride_contiguous", stride_contiguous, randn((3, 4))),
    Case("inplace_intermediate_then_reuse", inplace_intermediate_then_reuse, randn((3, 4))),
    Case("inplace_input_alias", inplace_on_input_and_return_alias, randn((3, 4))),
    Case(
        "setitem_with_tensor_index",
        setitem_with_tensor_index,
        lambda: (torch.randn(5), torch.tensor([0, 3])),
    ),
    Case("zero_grad_like", zero_grad_like, randn((3, 4))),
    Case("clamp_inplace_shape_bounds", clamp_inplace_bounds_from_shape, randn((3, 4))),
    # requires_grad_() turns an intermediate into a new autograd leaf, which a graph cannot
    # return: the graph breaks at the call (as torch.compile does), one graph on each side.
    Case("requires_grad_inplace", requires_grad_attribute_inplace, randn((3, 4)), graphs=2),
    Case("unsqueeze_inplace", unsqueeze_inplace, randn((3, 4))),
    Case("len_of_tensor", item_free_len, randn((3, 4))),
]
