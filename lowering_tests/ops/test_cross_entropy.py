"""Cross-entropy: the op against float64 (forward and gradient, every reduction), int32 targets and targets out
of range, and its bad input."""

import pytest
import torch
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.ops.library import OpInputError
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.tolerance import assert_close

IMPLS = ["triton", "reference"]
IGNORE = -100


def logits_and_target(rows, vocab, dtype=torch.float32, target_dtype=torch.int64):
    logits = (3 * torch.randn(rows, vocab, device=DEVICE)).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, (rows,), device=DEVICE, dtype=target_dtype)
    target[::3] = IGNORE  # some rows are padding
    return logits, target


@pytest.mark.parametrize("impl", IMPLS)
def test_opcheck(impl):
    logits, target = logits_and_target(5, 37)
    ops = torch.ops.turbo_inductor
    torch.library.opcheck(ops.cross_entropy_fwd, (logits, target, IGNORE, impl))
    torch.library.opcheck(ops.cross_entropy, (logits, target, IGNORE, "mean", impl))
    lse, dloss = torch.randn(5, device=DEVICE), torch.randn(5, device=DEVICE)
    torch.library.opcheck(ops.cross_entropy_bwd, (logits.detach(), target, lse, dloss, IGNORE, impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1, 300, 5000])  # one class; one chunk with a tail; two chunks (4096 + tail)
def test_against_float64(impl, dtype, vocab):
    logits, target = logits_and_target(7, vocab, dtype)
    for reduction in ("mean", "sum", "none"):
        logits.grad = None
        loss = turbo_inductor.ops.cross_entropy(logits, target, IGNORE, reduction, impl=impl)
        dloss = torch.randn_like(loss)
        loss.backward(dloss)
        x64 = logits.detach().double().requires_grad_()
        expected = F.cross_entropy(x64, target.long(), ignore_index=IGNORE, reduction=reduction)
        expected.backward(dloss.double())
        assert loss.dtype == torch.float32 and loss.shape == expected.shape
        assert_close(loss, expected, torch.float32)
        assert logits.grad.dtype == dtype
        assert_close(logits.grad, x64.grad, dtype)
        assert (logits.grad[target == IGNORE] == 0).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_int32_targets_and_a_target_out_of_range(impl):
    logits, target = logits_and_target(6, 50, target_dtype=torch.int32)
    loss = turbo_inductor.ops.cross_entropy(logits, target, IGNORE, "none", impl=impl)
    assert_close(loss, F.cross_entropy(logits.double(), target.long(), ignore_index=IGNORE, reduction="none"))
    target[1], target[2] = 50, -3  # neither a class nor ignored: NaN, never another row's or column's logit
    loss = turbo_inductor.ops.cross_entropy(logits, target, IGNORE, "none", impl=impl)
    assert loss[1:3].isnan().all() and not loss[3:].isnan().any() and loss[0] == 0


def test_bad_input_names_the_problem():
    logits, target = logits_and_target(4, 10)
    cases = [
        ((logits[None], target), "logits must be 2-D"),
        ((logits, target.float()), "target must be an int64 or int32"),
        ((logits, target[:3]), "target must be 1-D with logits' 4 rows"),
        ((logits[:, :0], target), "at least one class"),
    ]
    for args, message in cases:
        with pytest.raises(OpInputError, match=message):
            turbo_inductor.ops.cross_entropy(*args)
    with pytest.raises(OpInputError, match="reduction must be one of"):
        turbo_inductor.ops.cross_entropy(logits, target, reduction="max")
    rows = torch.randn(4, device=DEVICE)
    bad_rows = ((rows[:3], rows, r"lse must be fp32 \[4\]"), (rows, rows.double(), "dloss must be fp32"))
    for lse, dloss, message in bad_rows:
        with pytest.raises(OpInputError, match=message):
            torch.ops.turbo_inductor.cross_entropy_bwd(logits.detach(), target, lse, dloss)
