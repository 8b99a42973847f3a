"""The RMSNorm rewrites: which spellings are replaced, how many, in forward and backward, with the same results
as backend="inductor"; near misses left alone."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import (
    assert_left_alone,
    assert_matches_inductor,
    kernel_calls,
    ops_after,
    ops_before,
    rewrites_without_compiling,
    rewritten,
)

H = 64


class HFRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, with the weight on either side."""

    def __init__(self, eps=1e-6, weight_first=True, weight_dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(H, dtype=weight_dtype))
        self.eps, self.weight_first = eps, weight_first

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype) if self.weight_first else h.to(dtype) * self.weight


class TitanRMSNorm(nn.Module):
    """torchtitan's older RMSNorm: _norm(x.float()).type_as(x) * weight."""

    def __init__(self, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.randn(H)), eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class GemmaRMSNorm(nn.Module):
    """Gemma's: normalized and weighted (1 + w) in fp32, then cast back once."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(H))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.weight.float())).type_as(x)


class SqrtDivNorm(nn.Module):
    """No upcast, x * x, division by sqrt, no weight."""

    def forward(self, x):
        return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + 1e-5)


class FunctionalNorm(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.randn(H)), eps

    def forward(self, x):
        return F.rms_norm(x, (H,), self.weight, self.eps)


class ResidualBlock(nn.Module):
    """Pre-norm residual wiring: the sum feeds the norm and the next residual add."""

    def __init__(self, norm=HFRMSNorm):
        super().__init__()
        self.norm1, self.norm2 = norm(), nn.RMSNorm(H, eps=1e-6)
        self.proj = nn.Linear(H, H, bias=False)

    def forward(self, x, residual):
        h = x + residual
        h2 = h + self.proj(self.norm1(h))
        return self.norm2(h2), h2


class Stacked(nn.Module):
    def __init__(self, *mods):
        super().__init__()
        self.mods = nn.ModuleList(mods)

    def forward(self, x):
        for mod in self.mods:
            x = mod(x)
        return x


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def check_rewritten(counts, n, train, name="rmsnorm", op="turbo_inductor.rmsnorm"):
    assert counts[name] == n
    assert ops_before(op) == 0 and ops_after(op) == n
    assert ops_after("torch.rsqrt") == 0 and ops_after("Tensor.pow") == 0
    assert kernel_calls("rmsnorm_fwd") >= n
    assert (kernel_calls("rmsnorm_bwd") >= n) if train else (kernel_calls("rmsnorm_bwd") == 0)


class Spellings(nn.Module):
    """Every spelling, one after the other, in each of ``dtypes`` on an input of its own: 8 sites a dtype."""

    def __init__(self, dtypes):
        super().__init__()
        self.stacks = nn.ModuleList(
            Stacked(
                HFRMSNorm(),
                HFRMSNorm(weight_first=False, eps=1e-5),
                TitanRMSNorm(),
                GemmaRMSNorm(),
                nn.RMSNorm(H, eps=1e-6),
                nn.RMSNorm(H),
                FunctionalNorm(1e-4),
                SqrtDivNorm(),
            ).to(dtype)
            for dtype in dtypes
        )

    def forward(self, *xs):
        return tuple(stack(x) for stack, x in zip(self.stacks, xs))


# every dtype in training (forward and backward), one compile; inference, whose forward is the same op, in fp32
@pytest.mark.parametrize(
    "dtypes, train",
    [((torch.float32, torch.bfloat16, torch.float16), True), ((torch.float32,), False)],
    ids=["train", "inference"],
)
def test_spellings_are_rewritten(dtypes, train):
    inputs = [randn(2, 5, H, dtype=dtype) for dtype in dtypes]
    counts = assert_matches_inductor(Spellings(dtypes), inputs, train=train)
    check_rewritten(counts, 8 * len(dtypes), train)


def test_fp32_weight_on_bf16_input_keeps_the_promoting_multiply():
    """weight (fp32) * norm(x).to(bf16) is fp32: only the normalization is replaced, the multiply stays. The rows
    come as a matrix here (the other tests give three dims)."""
    model = HFRMSNorm(weight_dtype=torch.float32)
    counts = assert_matches_inductor(model, [randn(12, H, dtype=torch.bfloat16)], precision=torch.bfloat16)
    check_rewritten(counts, 1, True)
    assert turbo_inductor.compile_records()[-1].ops_after["mul"] == 1


@pytest.mark.parametrize("norm", [HFRMSNorm, GemmaRMSNorm])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_add_is_fused(dtype, norm):
    """Gemma's norm computes its weight, 1 + w in fp32, after the add: that moves before the fused op."""
    model = ResidualBlock(norm).to(dtype)
    counts = assert_matches_inductor(model, [randn(2, 3, H, dtype=dtype), randn(2, 3, H, dtype=dtype)])
    assert (counts["rmsnorm"], counts["rmsnorm_residual"]) == (0, 2)
    assert ops_after("turbo_inductor.rmsnorm_residual") == 2 and ops_after("turbo_inductor.rmsnorm") == 0
    assert kernel_calls("rmsnorm_bwd") == 2


def test_residual_add_is_fused_with_frozen_parameters():
    """Under Inductor's freezing Dynamo reads each norm weight by a get_attr placed just before the norm, after the
    residual add the fused op replaces: the weight is moved up, and both adds fuse as without freezing."""
    # on the GPU's device: torch 2.11 hands the passes a CPU graph under freezing without fake tensors
    # (system/test_backend.py)
    model = ResidualBlock().to(DEVICE, torch.bfloat16)
    inputs = [randn(2, 3, H, dtype=torch.bfloat16).to(DEVICE) for _ in range(2)]
    with torch._inductor.config.patch(freezing=True):
        counts = assert_matches_inductor(model, inputs, train=False)
    assert (counts["rmsnorm"], counts["rmsnorm_residual"]) == (0, 2)


def test_promoting_residual_add_under_autocast_is_fused():
    """Under torch.autocast the branch (a linear) returns bf16 while the residual stream stays fp32: the add
    promotes, and fuses as a same-dtype add does (the add's dtype, each addend's gradient in its own)."""
    model = ResidualBlock()
    # norm1 read by the bf16 linear alone would write bf16 (rmsnorm_autocast, tested with the reference kernels:
    # the Triton interpreter rounds bf16 stores toward zero, a bf16 ulp from Inductor's cast)
    with torch.autocast("cpu", torch.bfloat16):
        counts = assert_matches_inductor(model, [randn(2, 3, H), randn(2, 3, H)], options={"rmsnorm_autocast": False})
    assert (counts["rmsnorm"], counts["rmsnorm_residual"]) == (0, 2)
    assert ops_after("turbo_inductor.rmsnorm_residual") == 2 and ops_after("add") == 0


def test_broadcasting_add_is_not_a_residual():
    class Bias(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.bias = nn.RMSNorm(H), nn.Parameter(torch.randn(H))

        def forward(self, x):
            return self.norm(x + self.bias)

    # not compiled: the plain norm in fp32 is test_spellings_are_rewritten[train]'s; the rewritten graph run eagerly
    # shows the norm reads the add
    model, x = Bias(), randn(2, 3, H)
    out, record = rewritten(model, [x])
    assert (record.counts["rmsnorm"], record.counts["rmsnorm_residual"]) == (1, 0)
    assert ops_after("turbo_inductor.rmsnorm") == 1 and ops_after("add") == 1
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


def test_dynamic_batch_and_sequence_match_once_and_do_not_recompile():
    model = ResidualBlock()
    compiled = torch.compile(model, backend="primus_turbo")
    for batch, seq in [(2, 3), (3, 5), (4, 7)]:
        x, r = randn(batch, seq, H), randn(batch, seq, H)
        torch._dynamo.mark_dynamic(x, 0), torch._dynamo.mark_dynamic(x, 1)
        torch._dynamo.mark_dynamic(r, 0), torch._dynamo.mark_dynamic(r, 1)
        y, total = compiled(x, r)
        expected = model(x, r)
        torch.testing.assert_close(y, expected[0], rtol=1e-4, atol=1e-4)
        y.sum().backward()
    records = turbo_inductor.compile_records()
    assert len(records) == 1, "a new size must not recompile"
    assert (records[0].counts["rmsnorm"], records[0].counts["rmsnorm_residual"]) == (0, 2)


def test_dynamic_true_makes_eps_an_input_and_the_norms_still_fuse():
    """With ``dynamic=True`` Dynamo first passes the norms' float eps as graph inputs (read by ``.item()``). The
    norms match with that eps; our ops take eps as a float, so Dynamo's tensorify pass restarts the trace with eps
    specialized (guarded), and the graph compiled has the norms and residual adds fused, with Inductor's results.
    A changed eps recompiles and is used."""
    model = ResidualBlock()
    with torch._dynamo.config.patch(specialize_float=True):  # eps constant from the start: what the restart gives
        rewrites_without_compiling(model, [randn(2, 3, H), randn(2, 3, H)], dynamic=True)
        specialized = turbo_inductor.compile_records()
    # Inductor's static graph is test_residual_add_is_fused[dtype0]'s
    counts = assert_matches_inductor(model, [randn(2, 3, H), randn(2, 3, H)], dynamic=True, static_inductor=True)
    assert (counts["rmsnorm"], counts["rmsnorm_residual"]) == (0, 2)
    records = turbo_inductor.compile_records()
    assert len(records) == 1, "the abandoned trace's record is dropped"
    assert records[0].ops_before == specialized[0].ops_before and records[0].ops_before["Tensor.item"] == 0
    compiled = torch.compile(model, backend="primus_turbo", dynamic=True)
    for eps in (1e-6, 0.5):  # inputs that need gradients: the first eps can run the graph compiled above
        model.norm1.eps = eps
        x, r = randn(3, 5, H).requires_grad_(), randn(3, 5, H).requires_grad_()
        compiled_before = len(turbo_inductor.compile_records())
        torch.testing.assert_close(compiled(x, r), model(x, r), rtol=1e-4, atol=1e-4)
    assert len(turbo_inductor.compile_records()) == compiled_before + 1, "the changed eps recompiles"


class NearMiss(nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.variant, self.weight = variant, nn.Parameter(torch.randn(H))

    def forward(self, x):
        xf = x.float()
        v = self.variant
        if v == "mean_over_other_dim":
            return xf * torch.rsqrt(xf.pow(2).mean(-2, keepdim=True) + 1e-6) * self.weight
        if v == "cube":
            return xf * torch.rsqrt(xf.pow(3).mean(-1, keepdim=True) + 1e-6) * self.weight
        if v == "no_keepdim":
            return xf * torch.rsqrt(xf.pow(2).mean(-1) + 1e-6).unsqueeze(-1) * self.weight
        if v == "variance_used_elsewhere":
            var = xf.pow(2).mean(-1, keepdim=True)
            return xf * torch.rsqrt(var + 1e-6) * self.weight, var
        if v == "normalizes_another_tensor":
            return (xf + 1) * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        if v == "eps_outside_rsqrt":
            return xf * (torch.rsqrt(xf.pow(2).mean(-1, keepdim=True)) + 1e-6) * self.weight
        if v == "two_normalized_dims":
            return F.rms_norm(x.view(x.shape[0], -1, 8, 8), (8, 8))
        raise AssertionError(v)


@pytest.mark.parametrize(
    "variant",
    [
        "mean_over_other_dim",
        "cube",
        "no_keepdim",
        "variance_used_elsewhere",
        "normalizes_another_tensor",
        "eps_outside_rsqrt",
        "two_normalized_dims",
    ],
)
def test_near_misses_are_left_alone(variant):
    assert_left_alone(NearMiss(variant), [randn(3, 4, H)])


def test_float64_is_left_to_inductor():
    assert_left_alone(HFRMSNorm().double(), [randn(2, H).double()])


def test_gemma_norm_takes_and_saves_x_in_its_own_dtype():
    """Gemma's norm upcasts x and casts the weighted result back: the op takes x in bf16, so the backward keeps
    bf16 x, not its fp32 copy."""
    model = GemmaRMSNorm()
    counts = assert_matches_inductor(model, [randn(2, 5, H, dtype=torch.bfloat16)], precision=torch.bfloat16)
    check_rewritten(counts, 1, True)
    saved = []
    compiled = torch.compile(model, backend="primus_turbo")
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        compiled(randn(2, 5, H, dtype=torch.bfloat16))
    assert not [t for t in saved if t.dtype == torch.float32 and t.shape == (2, 5, H)]
