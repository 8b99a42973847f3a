"""Tensor parallelism on two real processes (gloo on CPU; NCCL and symmetric memory with a GPU per rank): the fused
GEMM + all-reduce and the column-parallel backward's all-reduce against the unfused model, and ranks that disagree on
shapes all getting an error that names them, not a hang."""

import pytest
import torch
import torch.distributed as dist

import turbo_inductor
from turbo_inductor.kernels.collective import gemm_allreduce as overlap
from turbo_inductor.kernels.symm_mem import gemm_allreduce as symm_mem_impl
from turbo_inductor.testing.distributed import (
    WORLD,
    ColumnParallel,
    RowParallel,
    init,
    matches_inductor,
    run_step,
    spawn,
)


def _cases_on_one_group(rank, port, cases):
    """Each ``(case, args)`` in turn, as ``case(group, device, *args)``, on one process group: a process spends
    seconds importing, more than most cases take."""
    group, device = init(rank, port)
    try:
        for case, args in cases:
            torch._dynamo.reset()
            turbo_inductor.reset_records()
            case(group, device, *args)
    finally:
        dist.destroy_process_group()


def _compiled_matches_unfused(group, device, spelling, impl, chunked):
    thresholds = overlap.CHUNK_MIN_ROWS, overlap.CHUNK_MIN_BYTES
    if chunked:  # small thresholds: row chunks (overlap, symm_mem) on small tensors
        overlap.CHUNK_MIN_ROWS, overlap.CHUNK_MIN_BYTES = 2, 0
    try:
        torch.manual_seed(0)  # the same weights on both ranks
        model = RowParallel(spelling, group).to(device)
        torch.manual_seed(1 + dist.get_rank())  # each rank its own shard of the input
        x = torch.randn(4, 5, 32).to(device)
        want = run_step(model, x, "inductor")
        model.zero_grad(set_to_none=True)
        turbo_inductor.reset_records()
        got = run_step(model, x, "primus_turbo", {"impl": impl})
        if impl == "symm_mem":  # its buffers were used (forward and backward)
            assert sum(symm_mem_impl.USES.values()) >= 2
        assert turbo_inductor.rewrite_counts()["gemm_allreduce"] == 1
        for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        # and the reduction really happened: the output is not this rank's partial result
        partial = torch.relu(model.proj(x)) * 2
        assert not torch.allclose(got[0], partial)
    finally:
        overlap.CHUNK_MIN_ROWS, overlap.CHUNK_MIN_BYTES = thresholds


def test_two_ranks_on_gloo_match_the_unfused_model():
    """The functional spelling whole, and the in-place one in row chunks (the overlap implementation)."""
    cases = [("funcol", "auto", False), ("in_place", "overlap", True)]
    spawn(_cases_on_one_group, [(_compiled_matches_unfused, case) for case in cases])


@pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason="symmetric memory: one GPU per rank")
def test_two_ranks_through_symmetric_memory_match_the_unfused_model():
    """Whole and in row chunks."""
    cases = [("funcol", "symm_mem", chunked) for chunked in (False, True)]
    spawn(_cases_on_one_group, [(_compiled_matches_unfused, case) for case in cases])


def _disagreeing_shapes(group, device):
    rank = dist.get_rank()
    x = torch.randn(4 + 2 * rank, 32, device=device)  # rank 1 has two more rows
    with pytest.raises(ValueError, match=rf"disagree on the shapes: this rank \(rank {rank}\)"):
        torch.ops.turbo_inductor.gemm_allreduce(x, torch.randn(24, 32, device=device), None, group.group_name)


def _disagreeing_shapes_compiled(group, device, spelling):
    rank = dist.get_rank()
    checks = []
    gather = dist.all_gather_object
    dist.all_gather_object = lambda *args, **kwargs: checks.append(1) or gather(*args, **kwargs)
    try:
        model = RowParallel(spelling, group).to(device)
        compiled = torch.compile(model, backend="primus_turbo")
        for _ in range(3):  # the ranks agree: one check, at the graph's first call
            compiled(torch.randn(4, 32, device=device)).sum().backward()
        assert len(checks) == 1 and turbo_inductor.rewrite_counts()["gemm_allreduce"] == 1
        for dynamic in (False, True):  # the rows a size the graph reads from its input at the call
            torch._dynamo.reset()
            x = torch.randn(4 + 2 * rank, 32, device=device)  # rank 1 has two more rows
            if dynamic:
                torch._dynamo.mark_dynamic(x, 0)
            with pytest.raises(
                ValueError, match=r"disagree on the shapes .*: rank 0 has \[\[4, 24\]\]; rank 1 has \[\[6, 24\]\]"
            ):
                torch.compile(model, backend="primus_turbo")(x)
    finally:
        dist.all_gather_object = gather


def test_ranks_that_disagree_on_shapes_all_get_an_error_naming_them_not_a_hang():
    """The op called eagerly, then compiled code, which checks the shapes it all-reduces once per graph, at its first
    call (per call, it would cost a host round trip): every rank raises, naming each rank's shapes. Both spellings
    become this one op (test_both_spellings_are_rewritten_in_training)."""
    cases = [(_disagreeing_shapes, ()), (_disagreeing_shapes_compiled, ("funcol",))]
    spawn(_cases_on_one_group, cases, timeout=300)


def _gradients_match_the_unfused_model(rank, port, spelling):
    group, device = init(rank, port)
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


def test_two_ranks_on_gloo_sum_the_input_gradient_as_the_unfused_model():
    """The real all-reduce of x's gradient; both spellings become this one op
    (test_the_input_gradients_all_reduce_joins_the_linear)."""
    spawn(_gradients_match_the_unfused_model, "funcol")
