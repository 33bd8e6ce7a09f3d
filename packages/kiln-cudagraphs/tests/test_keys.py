import pytest
import torch

from kiln_cudagraphs.keys import input_key, tensor_pointers


def test_equal_layouts_share_a_key_whatever_the_values():
    a = (torch.randn(4, 3), 2)
    b = (torch.randn(4, 3), 2)
    assert input_key(a) == input_key(b)


@pytest.mark.parametrize(
    "other",
    [
        (torch.randn(5, 3), 2),  # shape
        (torch.randn(3, 4).t(), 2),  # stride
        (torch.randn(4, 3, dtype=torch.float64), 2),  # dtype
        (torch.randn(4, 3), 3),  # a non-tensor value
        (torch.randn(4, 3), 2.0),  # its type
        (torch.randn(4, 3), True),
    ],
)
def test_what_a_replay_cannot_change_is_in_the_key(other):
    assert input_key((torch.randn(4, 3), 2)) != input_key(other)


def test_unhashable_input_is_named():
    with pytest.raises(TypeError, match=r"input 1 \(list\) cannot key a CUDA graph"):
        input_key((torch.randn(2), [1, 2]))


def test_pointers_of_tensor_inputs_only():
    x, w = torch.randn(3), torch.randn(3)
    assert tensor_pointers((x, 7, w)) == {0: x.data_ptr(), 2: w.data_ptr()}
