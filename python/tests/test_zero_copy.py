"""Tensors cross without copies: a given `out` is the tensor written and returned."""
import torch

from conftest import Case


def test_given_out_is_written_in_place():
    case = Case("sigmoid_renorm", M=10)
    layer = case.layer()
    expected = layer(case.hidden, case.logits)
    out = torch.full_like(expected, float("nan"))
    ptr = out.data_ptr()
    got = layer(case.hidden, case.logits, out=out)
    assert got is out and out.data_ptr() == ptr
    assert torch.equal(out, expected)  # every element overwritten (no NaN left)


def test_out_view_into_a_larger_buffer():
    """A contiguous slice of a bigger buffer is written where it lies, and nothing around it."""
    case = Case("topk", M=6)
    layer = case.layer()
    expected = layer(case.hidden, case.logits)
    big = torch.full((8, expected.shape[1]), 3.0, dtype=expected.dtype)
    layer(case.hidden, case.logits, out=big[1:7])
    assert torch.equal(big[1:7], expected)
    assert bool((big[0] == 3.0).all()) and bool((big[7] == 3.0).all())


def test_inputs_are_read_in_place():
    """hidden is read where it lies: changing it between calls changes the output."""
    case = Case("renormalize", M=4)
    layer = case.layer()
    hidden = case.hidden.clone()
    first = layer(hidden, case.logits).clone()
    hidden.mul_(2)
    assert not torch.equal(layer(hidden, case.logits), first)
