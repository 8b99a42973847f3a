"""The GLU rewrites: spellings replaced, counts, forward and backward on the fused op, same results as
backend="inductor"; near misses left alone."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.testing.compare import assert_left_alone, assert_matches_inductor, assert_ran, ops_after, rewritten
from turbo_inductor.testing.tolerance import assert_close

H, I = 32, 48  # noqa: E741  (hidden and intermediate sizes, as the models name them)


class SeparateMLP(nn.Module):
    """Hugging Face's LlamaMLP (act_fn = nn.SiLU) or torchtitan's FeedForward (F.silu, operands swapped)."""

    def __init__(self, style):
        super().__init__()
        self.style = style
        self.gate, self.up, self.down = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False), nn.Linear(I, H)
        self.act = nn.SiLU()

    def forward(self, x):
        if self.style == "hf":
            return self.down(self.act(self.gate(x)) * self.up(x))
        if self.style == "titan":
            return self.down(self.up(x) * F.silu(self.gate(x)))
        if self.style == "gelu":
            return self.down(F.gelu(self.gate(x)) * self.up(x))
        if self.style == "gelu_tanh":
            return self.down(F.gelu(self.gate(x), approximate="tanh") * self.up(x))
        raise AssertionError(self.style)


class FusedMLP(nn.Module):
    def __init__(self, split):
        super().__init__()
        self.split, self.gate_up, self.down = split, nn.Linear(H, 2 * I, bias=False), nn.Linear(I, H)

    def forward(self, x):
        h = self.gate_up(x)
        if self.split == "chunk":
            g, u = h.chunk(2, -1)
        elif self.split == "split":
            g, u = h.split(I, dim=-1)
        elif self.split == "split_list":
            g, u = torch.split(h, [I, I], -1)
        elif self.split == "slice":
            g, u = h[..., :I], h[..., I:]
        elif self.split == "up_first":  # halves in the other order: not the fused layout
            u, g = h.chunk(2, -1)
        return self.down(F.silu(g) * u)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def check(counts, op, n, train):
    assert counts["glu"] == n
    assert ops_after(op) == n
    assert ops_after("silu") == 0 and ops_after("gelu") == 0
    assert_ran("glu_fwd", n)
    assert_ran("glu_bwd", n if train else 0)


def check_wiring(model, inputs, op, muls=0):
    """One site on ``op``, for spellings whose op computes what a compiled test's does: nothing compiled, the
    rewritten graph run eagerly computes the model (the op gets the right operands)."""
    out, record = rewritten(model, inputs)
    assert record.counts["glu"] == 1 and ops_after(op) == 1
    assert ops_after("silu") == 0 and ops_after("gelu") == 0 and ops_after("mul") == muls
    with torch.no_grad():
        assert_close(out, model(*inputs))


# every activation in training (forward and backward); inference, whose forward is the same op, once
@pytest.mark.parametrize("style, train", [(style, True) for style in ("hf", "gelu", "gelu_tanh")] + [("hf", False)])
def test_separate_projections(style, train):
    counts = assert_matches_inductor(SeparateMLP(style), [randn(2, 5, H)], train=train)
    check(counts, "turbo_inductor.glu", 1, train)


def test_separate_projections_with_the_operands_swapped():
    """torchtitan's up * silu(gate): hf's op on the same operands (numerics: test_separate_projections[hf-True])."""
    check_wiring(SeparateMLP("titan"), [randn(2, 5, H)], "turbo_inductor.glu")


def test_fused_projection_is_read_in_place():
    counts = assert_matches_inductor(FusedMLP("chunk"), [randn(2, 5, H)])
    check(counts, "turbo_inductor.glu_fused", 1, True)
    record = turbo_inductor.compile_records()[-1]
    assert not any(record.ops_after[op] for op in ("Tensor.chunk", "Tensor.split", "split", "getitem"))


# the op reads the whole projection as for chunk (numerics: test_fused_projection_is_read_in_place)
@pytest.mark.parametrize("split", ["split", "split_list", "slice"])
def test_every_split_of_the_fused_projection_is_read_in_place(split):
    check_wiring(FusedMLP(split), [randn(2, 5, H)], "turbo_inductor.glu_fused")
    record = turbo_inductor.compile_records()[-1]
    assert not any(record.ops_after[op] for op in ("Tensor.chunk", "Tensor.split", "split", "getitem"))


def test_halves_in_the_other_order_use_the_two_tensor_op():
    """The two-tensor op on the halves, gate second (numerics: test_separate_projections[hf-True])."""
    check_wiring(FusedMLP("up_first"), [randn(2, 5, H)], "turbo_inductor.glu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    counts = assert_matches_inductor(FusedMLP("chunk").to(dtype), [randn(3, 4, H, dtype=dtype)])
    check(counts, "turbo_inductor.glu_fused", 1, True)


def test_dynamic_batch_and_sequence_do_not_recompile():
    model = FusedMLP("chunk")
    compiled = torch.compile(model, backend="primus_turbo")
    for batch, seq in [(2, 3), (3, 5), (4, 7)]:
        x = randn(batch, seq, H)
        torch._dynamo.mark_dynamic(x, 0), torch._dynamo.mark_dynamic(x, 1)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert len(turbo_inductor.compile_records()) == 1
    assert turbo_inductor.rewrite_counts()["glu"] == 1


class NearMiss(nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.variant, self.bias = variant, nn.Parameter(torch.randn(H))

    def forward(self, g, u):
        v = self.variant
        if v == "sigmoid":
            return torch.sigmoid(g) * u
        if v == "add":
            return F.silu(g) + u
        if v == "relu":
            return F.relu(g) * u
        if v == "broadcast":
            return F.silu(g) * self.bias
        if v == "activation_used_twice":
            a = F.silu(g)
            return a * u, a
        raise AssertionError(v)


@pytest.mark.parametrize("variant", ["sigmoid", "add", "relu", "broadcast", "activation_used_twice"])
def test_near_misses_are_left_alone(variant):
    assert_left_alone(NearMiss(variant), [randn(3, H), randn(3, H)])


class MoEExpert(nn.Module):
    """An expert's SwiGLU weighted by its router probabilities, as MoE layers write it."""

    def __init__(self, fused, spelling):
        super().__init__()
        self.fused, self.spelling = fused, spelling
        self.gate_up, self.down = nn.Linear(H, 2 * I, bias=False), nn.Linear(I, H)

    def forward(self, x, probs):
        g, u = self.gate_up(x).chunk(2, -1)
        if not self.fused:
            g, u = g.contiguous(), u.contiguous()  # two tensors: the glu op
        weight = {
            "none": probs[..., None],
            "unsqueeze": probs.unsqueeze(-1).to(x.dtype),
            "view": probs.view(*probs.shape, 1).to(x.dtype),
        }[self.spelling]
        return self.down(weight * (F.silu(g) * u))


@pytest.mark.parametrize("fused", [True, False])
def test_router_weight_goes_into_the_op(fused):
    x, probs = randn(2, 5, H), torch.rand(2, 5)
    counts = assert_matches_inductor(MoEExpert(fused, "none"), [x, probs])
    check(counts, "turbo_inductor.glu_fused" if fused else "turbo_inductor.glu", 1, True)
    # the weighting multiply is gone, and probs' gradient still matched inductor's: the op took the weight
    assert ops_after("mul") == 0


# the op takes the same weights whatever the spelling (numerics: test_router_weight_goes_into_the_op)
@pytest.mark.parametrize("spelling", ["unsqueeze", "view"])
@pytest.mark.parametrize("fused", [True, False])
def test_every_spelling_of_the_router_weight_goes_into_the_op(fused, spelling):
    op = "turbo_inductor.glu_fused" if fused else "turbo_inductor.glu"
    check_wiring(MoEExpert(fused, spelling), [randn(2, 5, H), torch.rand(2, 5)], op)


def test_router_weight_in_low_precision_is_left_as_a_multiply():
    """bf16 probs are not the op's fp32 router weights: the GLU is fused, the multiply stays (numerics: the fused op
    in bf16 is test_low_precision[dtype0]'s, and the multiply Inductor's either way)."""
    x, probs = randn(2, 5, H, dtype=torch.bfloat16), torch.rand(2, 5, dtype=torch.bfloat16)
    check_wiring(MoEExpert(True, "none").to(torch.bfloat16), [x, probs], "turbo_inductor.glu_fused", muls=1)
