"""Embedding: the op's lookup and weight gradient against float64, indices out of range, and its bad input."""

import pytest
import torch
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.ops.library import OpInputError
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.tolerance import assert_close

IMPLS = ["triton", "reference"]


def table_and_indices(vocab=50, hidden=40, tokens=(3, 37), dtype=torch.float32):
    weight = torch.randn(vocab, hidden, device=DEVICE, dtype=dtype, requires_grad=True)
    indices = torch.randint(0, vocab, tokens, device=DEVICE)
    indices[0, :20] = 7  # one frequent token: its rows take more than one step of the kernel's loop
    return weight, indices


@pytest.mark.parametrize("impl", IMPLS)
def test_opcheck(impl):
    weight, indices = table_and_indices()
    ops = torch.ops.turbo_inductor
    torch.library.opcheck(ops.embedding, (weight, indices, 3, impl))
    grad = torch.randn(*indices.shape, 40, device=DEVICE)
    torch.library.opcheck(ops.embedding_bwd, (grad, indices, 50, -1, impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("padding_idx", [None, 7, -2])
@pytest.mark.parametrize("hidden", [40, 1100])  # one column block; two, the second partial
def test_against_float64(impl, dtype, padding_idx, hidden):
    weight, indices = table_and_indices(hidden=hidden, dtype=dtype)
    out = turbo_inductor.ops.embedding(weight, indices, padding_idx, impl=impl)
    dout = torch.randn_like(out)
    out.backward(dout)
    w64 = weight.detach().double().requires_grad_()
    expected = F.embedding(indices, w64, padding_idx)
    expected.backward(dout.double())
    assert torch.equal(out, F.embedding(indices, weight.detach()))
    assert weight.grad.dtype == dtype
    assert_close(weight.grad, w64.grad, dtype)
    untouched = torch.ones(50, dtype=torch.bool, device=DEVICE)
    untouched[indices.flatten()] = False
    if padding_idx is not None:
        untouched[padding_idx] = True
    assert (weight.grad[untouched] == 0).all()


def test_bad_input_names_the_problem():
    weight, indices = table_and_indices()
    cases = [
        ((weight[0], indices, -1), "weight must be 2-D"),
        ((weight, indices.float(), -1), "indices must be an int64 or int32"),
        ((weight, indices, 50), r"padding_idx must be -1 \(none\) or a row in \[0, 50\)"),
    ]
    for args, message in cases:
        with pytest.raises(OpInputError, match=message):
            torch.ops.turbo_inductor.embedding(*args)


def test_the_triton_lookup_gives_nan_for_an_index_out_of_range():
    weight, indices = table_and_indices()
    indices[1, 2] = 50
    out = torch.ops.turbo_inductor.embedding(weight, indices, -1, "triton")
    assert out[1, 2].isnan().all() and not out[0].isnan().any()


@pytest.mark.parametrize("impl", IMPLS)
def test_indices_out_of_range_add_nothing_to_the_gradient(impl):
    weight, indices = table_and_indices()
    indices[1, :4] = torch.tensor([-5, -1, 50, 63])  # before and after every row once sorted
    grad = torch.randn(*indices.shape, 40, device=DEVICE)
    dweight = torch.ops.turbo_inductor.embedding_bwd(grad, indices, 50, -1, impl)
    keep = (indices >= 0) & (indices < 50)
    expected = torch.zeros(50, 40, dtype=torch.float64, device=DEVICE)
    expected.index_add_(0, indices[keep], grad[keep].double())
    assert_close(dweight, expected, torch.float32)
