"""A column-parallel linear's backward all-reduce (Megatron's copy-to-tensor-parallel region, an autograd function
that sums the gradient over the ranks) -> turbo_inductor.linear_dgrad_allreduce: the rewrite, its near misses, and
the gradients against the unfused model on two gloo processes."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from compare import assert_left_alone
from test_gemm_allreduce import _init, _run, _spawn, autocast_matches_inductor

import turbo_inductor


def autograd_function(name: str, forward, backward) -> type:
    """A ``torch.autograd.Function`` of one tensor with these forward and backward."""
    return type(
        name,
        (torch.autograd.Function,),
        {"forward": staticmethod(lambda ctx, x: forward(x)), "backward": staticmethod(lambda ctx, g: backward(g))},
    )


def sum_over_ranks(g):
    return funcol.all_reduce(g, "sum", dist.group.WORLD)


def sum_over_ranks_in_place(g):
    g = g.clone()
    dist.all_reduce(g, group=dist.group.WORLD)
    return g


def identity(x):
    return x.view_as(x)


# Megatron's copy to the tensor-parallel region in two spellings, and two near misses (a scaled sum; a forward that
# is not the identity).
SPELLINGS = {
    "funcol": autograd_function("CopyFuncol", identity, sum_over_ranks),
    "in_place": autograd_function("CopyInPlace", identity, sum_over_ranks_in_place),
    "scaled": autograd_function("CopyScaled", identity, lambda g: sum_over_ranks(g) * 0.5),
    "not_identity": autograd_function("NotIdentity", lambda x: x * 2, lambda g: sum_over_ranks(g) * 2),
}


class ColumnParallel(nn.Module):
    """A column-parallel linear as tensor-parallel code writes it; ``readers``: how many linears read the copy."""

    def __init__(self, spelling, readers=1, bias=True, out_features=24):
        super().__init__()
        self.copy, self.readers = SPELLINGS[spelling], readers
        self.proj = nn.Linear(32, out_features, bias=bias)
        if readers == 2:
            self.other = nn.Linear(32, 24, bias=False)

    def forward(self, x):
        h = self.copy.apply(x)
        y = self.proj(h)
        if self.readers == 2:
            y = y + self.other(h)
        return torch.relu(y) * 2


def matches_inductor(model, x, options=None):
    """Assert that primus_turbo's output and gradients equal Inductor's on ``model``; return them."""
    want = _run(model, x, "inductor")
    model.zero_grad(set_to_none=True)
    turbo_inductor.reset_records()
    got = _run(model, x, "primus_turbo", options)
    for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    return got


@pytest.mark.parametrize("spelling", ["funcol", "in_place"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_input_gradients_all_reduce_joins_the_linear(fake_group, spelling, bias):
    torch.manual_seed(0)
    matches_inductor(
        ColumnParallel(spelling, bias=bias), torch.randn(2, 5, 32), {"impl": "reference", "record_graphs": True}
    )
    assert turbo_inductor.rewrite_counts()["gemm_allreduce_dgrad"] == 1
    record = turbo_inductor.compile_records()[-1]
    assert record.ops_before["autograd_function_apply"] == 1
    assert record.ops_after["autograd_function_apply"] == 0
    assert record.ops_after["turbo_inductor.linear_dgrad_allreduce"] == 1 and record.ops_after["linear"] == 0
    # the backward's GEMM + all-reduce runs our kernel (recorded on a cache hit too, where no kernel is traced)
    assert record.implementations["gemm_allreduce_fwd"] == ["reference"]


def test_under_autocast_the_op_computes_in_the_autocast_dtype(fake_group):
    """fp32 parameters under torch.autocast(bfloat16): the fused op takes the operands cast to bf16, as autocast
    casts them for the linear, and returns bf16 as Inductor's graph does; its backward all-reduces x's gradient in
    bf16 before it is cast back to fp32 (the unfused graph sums the fp32 cast: within bf16's rounding)."""
    torch.manual_seed(0)
    got = autocast_matches_inductor(ColumnParallel("funcol"), torch.randn(2, 5, 32))
    assert turbo_inductor.rewrite_counts()["gemm_allreduce_dgrad"] == 1
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.float32


@pytest.mark.parametrize("spelling, readers", [("scaled", 1), ("not_identity", 1), ("funcol", 2)])
def test_near_misses_are_left_alone(fake_group, spelling, readers):
    assert_left_alone(ColumnParallel(spelling, readers), [torch.randn(2, 5, 32)])


def test_fp8_keeps_its_linear_and_the_gradients_all_reduce(fake_group):
    model = ColumnParallel("funcol", out_features=32)  # an FP8 GEMM shape
    compiled = torch.compile(model, backend="primus_turbo", options={"fp8": "rowwise", "impl": "reference"})
    compiled(torch.randn(3, 5, 32, requires_grad=True)).sum().backward()  # x's gradient: the function stays
    assert turbo_inductor.rewrite_counts()["gemm_allreduce_dgrad"] == 0 and turbo_inductor.rewrite_counts()["fp8"] == 1
    assert turbo_inductor.compile_records()[-1].ops_after["autograd_function_apply"] == 1


def test_python_api_runs_both_tensor_parallel_linears_and_their_gradients(fake_group):
    x, w, b = torch.randn(6, 32, requires_grad=True), torch.randn(24, 32, requires_grad=True), torch.randn(24)
    for op in (turbo_inductor.ops.gemm_allreduce, turbo_inductor.ops.linear_dgrad_allreduce):
        for group in (None, fake_group, fake_group.group_name):  # the fake all-reduce returns its input
            y = op(x, w, b, group, impl="reference")
            torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b))
            dx, dw = torch.autograd.grad(y, (x, w), torch.ones_like(y))
            torch.testing.assert_close(dx, torch.ones_like(y) @ w)
            torch.testing.assert_close(dw, torch.ones_like(y).t() @ x)


def test_opcheck(fake_group):
    x, w, b = torch.randn(6, 32), torch.randn(24, 32), torch.randn(24)
    torch.library.opcheck(torch.ops.turbo_inductor.linear_dgrad_allreduce, (x, w, b, fake_group.group_name, "auto"))
    torch.library.opcheck(
        torch.ops.turbo_inductor.linear_dgrad_allreduce_bwd, (torch.randn(6, 24), x, w, fake_group.group_name, "auto")
    )


def _gradients_match_the_unfused_model(rank, port, spelling):
    group, device = _init(rank, port)
    try:
        torch.manual_seed(0)  # the same weights on both ranks
        model = ColumnParallel(spelling).to(device)
        torch.manual_seed(1 + rank)  # each rank its own input (and so its own output gradient)
        x = torch.randn(4, 5, 32).to(device)
        got = matches_inductor(model, x)
        assert turbo_inductor.rewrite_counts()["gemm_allreduce_dgrad"] == 1
        # and the input gradient is the sum over the ranks of each rank's own (computed here eagerly, summed by gloo)
        xl = x.detach().clone().requires_grad_()
        (torch.relu(model.proj(xl)) * 2).backward(torch.ones(4, 5, 24, device=device))
        summed = xl.grad.clone()
        dist.all_reduce(summed, group=group)
        assert not torch.allclose(got[1], xl.grad)
        torch.testing.assert_close(got[1], summed, rtol=1e-5, atol=1e-5)
    finally:
        dist.destroy_process_group()


def test_two_ranks_on_gloo_match_the_unfused_model():
    """The real all-reduce of x's gradient; both spellings become this one op
    (test_the_input_gradients_all_reduce_joins_the_linear)."""
    _spawn(_gradients_match_the_unfused_model, "funcol")
