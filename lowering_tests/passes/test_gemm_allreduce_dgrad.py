"""The gemm_allreduce_dgrad pass: a column-parallel linear's backward all-reduce (Megatron's copy to the
tensor-parallel region, an autograd function that sums the gradient over the ranks) ->
turbo_inductor.linear_dgrad_allreduce, under autocast, FP8 keeping its linear, near misses left alone. Two real
processes: system/test_distributed.py."""

import pytest
import torch

import turbo_inductor
from turbo_inductor.testing.compare import assert_left_alone
from turbo_inductor.testing.distributed import ColumnParallel, autocast_matches_inductor, matches_inductor


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
