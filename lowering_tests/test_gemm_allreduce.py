"""GEMM + all-reduce: the rewrite of both spellings Dynamo gives, the op forward and backward against the unfused
computation, overlap chunking, and ranks that disagree on shapes. Two real processes on gloo (CPU); the graph-level
tests use one process in a fake process group of two."""

import os
import re
import socket
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
import torch.nn as nn
from compare import assert_left_alone, default_counts
from torch._inductor.utils import run_and_get_code

import turbo_inductor
from turbo_inductor.kernels import registry
from turbo_inductor.kernels.collective import gemm_allreduce as overlap
from turbo_inductor.kernels.symm_mem import gemm_allreduce as symm_mem_impl

WORLD = 2


class RowParallel(nn.Module):
    """A row-parallel linear as tensor-parallel code writes it: its partial result all-reduced over the group."""

    def __init__(self, spelling, group, bias=True, out_features=24):
        super().__init__()
        self.spelling, self.group = spelling, group
        self.proj = nn.Linear(32, out_features, bias=bias)

    def forward(self, x):
        y = self.proj(x)
        if self.spelling == "funcol":
            y = funcol.all_reduce(y, "sum", self.group)
        else:
            dist.all_reduce(y, group=self.group)
        return torch.relu(y) * 2


def _run(model, x, backend, options=None, dynamic=None):
    torch._dynamo.reset()
    x = x.detach().clone().requires_grad_()
    out = torch.compile(model, backend=backend, options=options, dynamic=dynamic)(x)
    out.backward(torch.ones_like(out))
    return out.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


# ---- one process, fake group (graph-level: the fake all-reduce returns its input) -----------------------------


@pytest.mark.parametrize("spelling", ["funcol", "in_place"])
@pytest.mark.parametrize("bias", [True, False])
def test_both_spellings_are_rewritten_in_training(fake_group, spelling, bias):
    torch.manual_seed(0)
    model = RowParallel(spelling, fake_group, bias)
    x = torch.randn(3, 5, 32)
    want = _run(model, x, "inductor")
    model.zero_grad(set_to_none=True)
    turbo_inductor.reset_records()
    got = _run(model, x, "primus_turbo")
    assert turbo_inductor.rewrite_counts()["gemm_allreduce"] == 1
    record = turbo_inductor.compile_records()[-1]
    assert record.ops_before["_c10d_functional.all_reduce"] == 1
    assert (
        record.ops_after["_c10d_functional.all_reduce"] == 0 and record.ops_after["turbo_inductor.gemm_allreduce"] == 1
    )
    assert record.ops_after["Tensor.copy_"] == 0
    for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spelling", ["funcol", "in_place"])
def test_under_autocast_the_op_computes_in_the_autocast_dtype(fake_group, spelling):
    """fp32 parameters under torch.autocast(bfloat16): the linear computes in bf16, and so does the fused op, its
    operands cast as autocast casts them; its bf16 result is what is all-reduced, as in Inductor's graph."""
    torch.manual_seed(0)
    got = autocast_matches_inductor(RowParallel(spelling, fake_group), torch.randn(3, 5, 32))
    assert turbo_inductor.rewrite_counts()["gemm_allreduce"] == 1
    assert got[0].dtype == torch.bfloat16


def autocast_matches_inductor(model, x):
    """primus_turbo's (output, x's gradient, parameters' gradients) of ``model`` under autocast(bfloat16), asserted
    equal to Inductor's in dtype and within bf16's rounding; returned."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _run(model, x, "inductor")
        model.zero_grad(set_to_none=True)
        turbo_inductor.reset_records()
        got = _run(model, x, "primus_turbo")
    for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)
    return got


class NearMiss(nn.Module):
    def __init__(self, variant, group):
        super().__init__()
        self.variant, self.group, self.proj = variant, group, nn.Linear(32, 24)

    def forward(self, x):
        y = self.proj(x)
        if self.variant == "max":
            return funcol.all_reduce(y, "max", self.group)
        if self.variant == "unreduced_read_too":
            return funcol.all_reduce(y, "sum", self.group) + y
        if self.variant == "read_before_the_copy":
            before = y * 1.5
            dist.all_reduce(y, group=self.group)
            return y + before
        raise AssertionError(self.variant)


@pytest.mark.parametrize("variant", ["max", "unreduced_read_too", "read_before_the_copy"])
def test_near_misses_are_left_alone(fake_group, variant):
    # inference: torch's all-reduce has a backward for sum only
    assert_left_alone(NearMiss(variant, fake_group), [torch.randn(4, 32)], train=False)


@pytest.mark.parametrize("impl, chunks", [("auto", 1), ("overlap", 4)])
def test_traced_into_the_graph_as_functional_collectives(fake_group, impl, chunks, monkeypatch):
    """The op's body is traced: the compiled code issues the functional all-reduces itself (one per chunk, in
    forward and backward) and never calls back into a turbo_inductor op, so no host work is added per call."""
    monkeypatch.setattr(overlap, "CHUNK_MIN_ROWS", 2)
    monkeypatch.setattr(overlap, "CHUNK_MIN_BYTES", 0)
    model = RowParallel("funcol", fake_group)
    x = torch.randn(4, 5, 32, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="primus_turbo", options={"impl": impl})
    _, codes = run_and_get_code(lambda: compiled(x).sum().backward())
    assert turbo_inductor.rewrite_counts()["gemm_allreduce"] == 1
    for code in codes:
        assert "turbo_inductor" not in code
        assert len(re.findall(r"_c10d_functional\.all_reduce_?\.default\(", code)) == chunks, code


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


@pytest.mark.parametrize("spelling", ["funcol", "in_place"])
def test_a_frozen_weight_costs_no_wgrad(fake_group, spelling):
    """A row-parallel linear whose weight wants no gradient (a frozen base model's, as LoRA trains it): x's and the
    bias's gradients are Inductor's, the weight gets none. The op's autograd saves no x and its backward gets
    none, so no implementation runs a wgrad GEMM (a traced one's would be dead code anyway; an opaque one, as
    symm_mem's, would run it)."""
    torch.manual_seed(0)
    model = RowParallel(spelling, fake_group)
    model.proj.weight.requires_grad_(False)
    x = torch.randn(3, 5, 32)
    results = {}
    for backend in ("inductor", "primus_turbo"):
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        torch.compile(model, backend=backend)(xi).sum().backward()
        results[backend] = xi.grad, model.proj.bias.grad
    assert turbo_inductor.rewrite_counts()["gemm_allreduce"] == 1
    assert model.proj.weight.grad is None
    for got, want in zip(results["primus_turbo"], results["inductor"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for trainable in (True, False):
        model.proj.weight.requires_grad_(trainable)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
            y = turbo_inductor.ops.gemm_allreduce(
                x.clone().requires_grad_(), model.proj.weight, model.proj.bias, fake_group
            )
        assert (x.shape in saved) is trainable, saved
        y.sum().backward()


def test_unknown_group_and_uninitialized_distributed_are_named(fake_group):
    x, w = torch.randn(6, 32), torch.randn(24, 32)
    with pytest.raises(ValueError, match="no process group named 'nope'"):
        torch.ops.turbo_inductor.gemm_allreduce(x, w, None, "nope")


def test_without_distributed_the_op_says_so():
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        torch.ops.turbo_inductor.gemm_allreduce(torch.randn(6, 32), torch.randn(24, 32), None, "0")


@pytest.mark.parametrize("count", [overlap.CHUNKS, 1, 3, 8])
def test_chunks_cover_every_row_once_and_small_sizes_stay_whole(count):
    assert overlap.row_chunks(100, 1 << 20, count) == [(0, 100)]  # too few rows
    assert overlap.row_chunks(8192, 16, count) == [(0, 8192)]  # too few bytes
    chunks = overlap.row_chunks(8190, 4096 * 2, count)
    assert len(chunks) == count and chunks[0][0] == 0 and chunks[-1][1] == 8190
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_peer_pushes_into_a_slot_of_its_own(world):
    for destination in range(world):
        slots = [
            symm_mem_impl.peer_slot(source, destination, world) for source in range(world) if source != destination
        ]
        assert sorted(slots) == list(range(world - 1))


# ---- two processes on gloo ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(worker, *args, timeout: float = 600):
    """``worker(rank, port, *args)`` on each rank; a rank still running after ``timeout`` seconds fails the test."""
    port = _free_port()
    context = mp.start_processes(
        _run_then_exit, args=(worker, port, *args), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError(f"{worker.__name__} still ran after {timeout} s: a hang")


def _run_then_exit(rank, worker, port, *args):
    """``worker`` on this rank, then an immediate exit: about one run in ten, a background thread of the
    distributed / compile stack still ran at interpreter shutdown and the process aborted ("terminate called without
    an active exception") after the test had passed. A failure still raises (and is reported) before this."""
    worker(rank, port, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _init(rank: int, port: int):
    """NCCL with one GPU per rank where there are enough GPUs, else gloo on CPU (the environment, TRITON_INTERPRET
    included, is the parent's)."""
    torch.set_num_threads(1)
    if torch.cuda.device_count() >= WORLD:
        torch.cuda.set_device(rank)
        backend, device = "nccl", torch.device("cuda", rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    return dist.group.WORLD, device


def _cases_on_one_group(rank, port, cases):
    """Each ``(case, args)`` in turn, as ``case(group, device, *args)``, on one process group: a process spends
    seconds importing, more than most cases take."""
    group, device = _init(rank, port)
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
        want = _run(model, x, "inductor")
        model.zero_grad(set_to_none=True)
        turbo_inductor.reset_records()
        got = _run(model, x, "primus_turbo", {"impl": impl})
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
    _spawn(_cases_on_one_group, [(_compiled_matches_unfused, case) for case in cases])


@pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason="symmetric memory: one GPU per rank")
def test_two_ranks_through_symmetric_memory_match_the_unfused_model():
    """Whole and in row chunks."""
    cases = [("funcol", "symm_mem", chunked) for chunked in (False, True)]
    _spawn(_cases_on_one_group, [(_compiled_matches_unfused, case) for case in cases])


def test_symmetric_memory_is_a_gpu_implementation_and_autotune_leaves_collectives_alone(fake_group, monkeypatch):
    symm_mem = registry.implementations("gemm_allreduce_fwd")["symm_mem"]
    assert symm_mem.unavailable_reason(torch.device("cpu")) == "symmetric memory needs a GPU"
    # Each rank pushes its whole partial to each peer: beyond MAX_RANKS that is more than twice a ring's data.
    args = (torch.randn(6, 32), torch.randn(24, 32), None, fake_group.group_name)
    assert symm_mem.declines(*args) is None
    monkeypatch.setattr(symm_mem_impl, "MAX_RANKS", WORLD - 1)
    assert "groups of 2 to 1 ranks" in symm_mem.declines(*args)
    # Its extern ops have exact fakes: a compiled graph calls them with the shapes the op has.
    x, w = torch.randn(6, 32, device="meta"), torch.randn(24, 32, device="meta")
    assert torch.ops.turbo_inductor_symm_mem.gemm_allreduce_fwd(x, w, None, "g").shape == (6, 24)
    dx, dw, db = torch.ops.turbo_inductor_symm_mem.gemm_allreduce_bwd(torch.randn(6, 24, device="meta"), x, w, "g")
    assert (dx.shape, dw.shape, db.shape) == (x.shape, w.shape, (24,))
    # Each rank would time and choose alone: ranks choosing differently would issue mismatched collectives.
    for kernel in ("gemm_allreduce_fwd", "gemm_allreduce_bwd"):
        assert registry._resolve(kernel, torch.device("cpu"), "autotune")[0] == "auto"
    assert registry._resolve("rmsnorm_fwd", torch.device("cpu"), "autotune")[0] == "autotune"


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
    _spawn(_cases_on_one_group, cases, timeout=300)


class TensorParallelBlock(nn.Module):
    """The row-parallel output projection, its all-reduce, the residual add and the next pre-norm."""

    def __init__(self, group):
        super().__init__()
        self.group, self.o_proj, self.norm = group, nn.Linear(32, 32, bias=False), nn.RMSNorm(32, eps=1e-6)

    def forward(self, x, residual):
        h = residual + funcol.all_reduce(self.o_proj(x), "sum", self.group)
        return self.norm(h), h


def test_all_reduce_then_residual_add_and_rmsnorm_become_two_fused_ops(fake_group):
    torch.manual_seed(0)
    model = TensorParallelBlock(fake_group)
    x, residual = torch.randn(2, 6, 32, requires_grad=True), torch.randn(2, 6, 32, requires_grad=True)
    outs = {}
    for backend in ("inductor", "primus_turbo"):
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        model.zero_grad(set_to_none=True)
        inputs = [t.detach().clone().requires_grad_() for t in (x, residual)]
        normed, h = torch.compile(model, backend=backend)(*inputs)
        (normed.square().sum() + h.sum()).backward()
        outs[backend] = [normed, h, *(t.grad for t in inputs), *(p.grad for p in model.parameters())]
    assert turbo_inductor.rewrite_counts() == default_counts(rmsnorm_residual=1, gemm_allreduce=1)
    for got, want in zip(outs["primus_turbo"], outs["inductor"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_dynamic_batch_does_not_recompile(fake_group):
    model = RowParallel("funcol", fake_group)
    compiled = torch.compile(model, backend="primus_turbo")
    for batch in (3, 5, 9):
        x = torch.randn(batch, 4, 32)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), torch.relu(model.proj(x)) * 2)  # the fake all-reduce: identity
    assert len(turbo_inductor.compile_records()) == 1, "a new size must not recompile"
    assert turbo_inductor.rewrite_counts()["gemm_allreduce"] == 1


def test_fp8_keeps_its_linears_and_their_all_reduce(fake_group):
    model = RowParallel("funcol", fake_group, out_features=32)  # an FP8 GEMM shape
    compiled = torch.compile(model, backend="primus_turbo", options={"fp8": "rowwise", "impl": "reference"})
    compiled(torch.randn(3, 5, 32)).sum().backward()
    assert turbo_inductor.rewrite_counts()["gemm_allreduce"] == 0 and turbo_inductor.rewrite_counts()["fp8"] == 1
    assert turbo_inductor.compile_records()[-1].ops_after["_c10d_functional.all_reduce"] == 1
