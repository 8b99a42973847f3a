"""The tensor-parallel ops: GEMM + all-reduce and the column-parallel linear whose input gradient is all-reduced,
their Python API forward and backward, opcheck, and a group that is unknown or missing."""

import pytest
import torch

import turbo_inductor


def test_opcheck(fake_group):
    x, w, b = torch.randn(6, 32), torch.randn(24, 32), torch.randn(24)
    torch.library.opcheck(torch.ops.turbo_inductor.gemm_allreduce, (x, w, b, fake_group.group_name, "auto"))
    torch.library.opcheck(
        torch.ops.turbo_inductor.gemm_allreduce_bwd, (torch.randn(6, 24), x, w, fake_group.group_name, "auto")
    )
    # a weight that wants no gradient: no x saved, an empty dweight
    torch.library.opcheck(
        torch.ops.turbo_inductor.gemm_allreduce_bwd, (torch.randn(6, 24), None, w, fake_group.group_name, "auto")
    )
    torch.library.opcheck(
        torch.ops.turbo_inductor.linear_dgrad_allreduce_bwd,
        (torch.randn(6, 24), None, w, fake_group.group_name, "auto"),
    )
    for op in (torch.ops.turbo_inductor.gemm_allreduce_bwd, torch.ops.turbo_inductor.linear_dgrad_allreduce_bwd):
        dx, dweight = op(torch.randn(2, 3, 24), None, w, fake_group.group_name)[:2]
        assert dx.shape == (2, 3, 32) and dweight.shape == (0,)


def test_unknown_group_and_uninitialized_distributed_are_named(fake_group):
    x, w = torch.randn(6, 32), torch.randn(24, 32)
    with pytest.raises(ValueError, match="no process group named 'nope'"):
        torch.ops.turbo_inductor.gemm_allreduce(x, w, None, "nope")


def test_without_distributed_the_op_says_so():
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        torch.ops.turbo_inductor.gemm_allreduce(torch.randn(6, 32), torch.randn(24, 32), None, "0")


def test_python_api_runs_both_tensor_parallel_linears_and_their_gradients(fake_group):
    x, w, b = torch.randn(6, 32, requires_grad=True), torch.randn(24, 32, requires_grad=True), torch.randn(24)
    for op in (turbo_inductor.ops.gemm_allreduce, turbo_inductor.ops.linear_dgrad_allreduce):
        for group in (None, fake_group, fake_group.group_name):  # the fake all-reduce returns its input
            y = op(x, w, b, group, impl="reference")
            torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b))
            dx, dw = torch.autograd.grad(y, (x, w), torch.ones_like(y))
            torch.testing.assert_close(dx, torch.ones_like(y) @ w)
            torch.testing.assert_close(dw, torch.ones_like(y).t() @ x)


def test_linear_dgrad_allreduce_opcheck(fake_group):
    x, w, b = torch.randn(6, 32), torch.randn(24, 32), torch.randn(24)
    torch.library.opcheck(torch.ops.turbo_inductor.linear_dgrad_allreduce, (x, w, b, fake_group.group_name, "auto"))
    torch.library.opcheck(
        torch.ops.turbo_inductor.linear_dgrad_allreduce_bwd, (torch.randn(6, 24), x, w, fake_group.group_name, "auto")
    )
