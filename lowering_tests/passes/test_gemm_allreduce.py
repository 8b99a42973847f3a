"""The gemm_allreduce pass: a row-parallel linear and its all-reduce, in both spellings Dynamo gives, as one op
(training, autocast, frozen weights, dynamic batch, traced into the graph as functional collectives), the residual
add and norm after it fused too, FP8 keeping its linears, near misses left alone. One process in a fake process
group of two (its all-reduce returns its input); two real processes: system/test_distributed.py."""

import re

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch._inductor.utils import run_and_get_code

import turbo_inductor
from turbo_inductor.kernels.collective import gemm_allreduce as overlap
from turbo_inductor.testing.compare import assert_left_alone, default_counts
from turbo_inductor.testing.distributed import RowParallel, autocast_matches_inductor, run_step


@pytest.mark.parametrize("spelling", ["funcol", "in_place"])
@pytest.mark.parametrize("bias", [True, False])
def test_both_spellings_are_rewritten_in_training(fake_group, spelling, bias):
    torch.manual_seed(0)
    model = RowParallel(spelling, fake_group, bias)
    x = torch.randn(3, 5, 32)
    want = run_step(model, x, "inductor")
    model.zero_grad(set_to_none=True)
    turbo_inductor.reset_records()
    got = run_step(model, x, "primus_turbo")
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
