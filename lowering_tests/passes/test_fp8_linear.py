"""The fp8 pass: an unmodified model's linears rewritten into FP8 linears (every recipe and matmul spelling,
autocast, frozen weights and frozen inference, the option's filters and ``save_weight_t``), and a short training
run that follows the high-precision loss curve."""

import functools
import math
import os
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.ops.fp8_linear import FP8LinearNode
from turbo_inductor.passes import ir
from turbo_inductor.recipes import RECIPES, FP8Config
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_ran, frozen_and_not, kernel_calls, ops_after, run
from turbo_inductor.testing.fp8 import Readers
from turbo_inductor.testing.graph import capture, rewrite
from turbo_inductor.testing.tolerance import snr_db

GRADIENT_GATE = {"e4m3": 25.0, "e5m2": 20.0}  # the FP8 gates (docs/fp8.md): SNR in dB by gradient format
# Triton's CPU interpreter rounds ~2% of fp8 stores wrongly: the SNR gates are checked with the reference kernels
# on CPU and with the default (fastest) ones on the GPU.
EXACT_IMPL = "auto" if DEVICE == "cuda" else "reference"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64, bias=False)
        self.head, self.odd = nn.Linear(64, 32), nn.Linear(64, 20)  # odd: 20 outputs, not an FP8 GEMM shape

    def forward(self, x):
        h = self.down(F.gelu(self.up(x)))
        return self.head(h), self.odd(h)


def fp8_twin(model, recipe):
    """The same model written by hand with the FP8 op: what the rewrite must compute."""

    def forward(x):
        def lin(layer):
            return lambda t: turbo_inductor.ops.fp8_linear(t, layer.weight, layer.bias, recipe, impl="reference")

        h = lin(model.down)(F.gelu(lin(model.up)(x)))
        return lin(model.head)(h), model.odd(h)

    return forward


@pytest.mark.skipif(DEVICE == "cuda", reason="kernel calls are counted per run only where the ops stay calls (CPU)")
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_frozen_weight_costs_no_wgrad(recipe):
    """A weight that wants no gradient (a frozen base model's, as LoRA trains it): its linear's forward quantizes no
    x^T and its backward runs no wgrad GEMM, as backend="inductor" runs no wgrad mm; the other gradients are those
    of the same model with the weight trainable, bit for bit."""
    x, results = torch.randn(2, 8, 64), {}
    for frozen in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
        model[0].requires_grad_(not frozen)
        turbo_inductor.reset_kernel_calls()
        outs, grads = run(model, [x], "primus_turbo", options={"fp8": recipe})
        results[frozen] = outs, grads, kernel_calls("fp8_gemm")
    (outs, grads, gemms), (frozen_outs, frozen_grads, frozen_gemms) = results[False], results[True]
    assert frozen_grads[1] is None and frozen_grads[2] is None  # layer 0's weight and bias
    # 2 forward GEMMs, then dgrad and wgrad per layer; a high-precision wgrad is no FP8 GEMM
    assert (gemms, frozen_gemms) == ((4, 4) if RECIPES[recipe].high_precision_wgrad else (6, 5))
    for got, want in zip(frozen_outs + frozen_grads[:1] + frozen_grads[3:], outs + grads[:1] + grads[3:]):
        assert torch.equal(got, want)


class AutocastByHand(nn.Module):
    """``nn.Sequential(linear, ReLU, linear, linear)`` of fp32 parameters as the rewrite runs it under bf16 autocast:
    FP8 linears of bf16 x and bias and of the fp32 weight."""

    def __init__(self, model: nn.Sequential, recipe: str):
        super().__init__()
        self.model, self.recipe = model, recipe

    def forward(self, t):
        for layer in self.model:
            if isinstance(layer, nn.ReLU):
                t = layer(t)
                continue
            bias = None if layer.bias is None else layer.bias.to(torch.bfloat16)
            t = turbo_inductor.ops.fp8_linear(t.to(torch.bfloat16), layer.weight, bias, self.recipe, impl=EXACT_IMPL)
        return t


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_under_autocast_every_linear_becomes_fp8_in_the_autocast_dtype(recipe):
    """fp32 parameters trained under torch.autocast(bfloat16), as mixed-precision training runs: each linear computes
    in bf16 whatever its operands' dtypes (x fp32 or bf16, W fp32), so each becomes an FP8 linear on x and bias cast
    to bf16, as autocast casts them, and on W as it is: quantized from fp32, its gradient written in fp32 by the
    wgrad GEMM, with no cast of W or dW in the graph. The outputs are bf16 as under Inductor, the gradients fp32,
    and both are those of the op called by hand (ReLU, which autocast leaves alone, between the linears): on CPU the
    output bit for bit and the gradients within a bf16 rounding (Inductor fuses the bias gradients' casts); on the
    GPU at the FP8 noise level, where a last-bit difference in another buffer moves an amax. The gates against an
    fp32 reference: ops/test_fp8_linear.py."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64, bias=False), nn.Linear(64, 32)).to(DEVICE)
    x = torch.randn(2, 8, 64, device=DEVICE)
    options = {"fp8": recipe, "impl": EXACT_IMPL}
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        (out,), grads = run(model, [x], "primus_turbo", options=options)
        assert turbo_inductor.rewrite_counts()["fp8"] == 3  # x fp32 for the first, bf16 for the others
        assert ops_after("TensorBase.to") == 3  # x and two biases: no weight is cast
        assert run(model, [x], "inductor")[0][0].dtype == out.dtype == torch.bfloat16
    assert all(g.dtype == torch.float32 for g in grads)

    (want,), want_grads = run(AutocastByHand(model, recipe), [x], "eager")
    if DEVICE == "cuda":
        assert snr_db(out, want) >= 30
        assert all(snr_db(got, expected) >= 30 for got, expected in zip(grads, want_grads))
        return
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected, rtol=2**-8, atol=0)


@pytest.mark.skipif(DEVICE == "cuda", reason="traced into the graph on the GPU: system/test_gpu.py reads its code")
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_frozen_inference_quantizes_the_weights_when_compiling(recipe):
    """Under freezing, W's quantization is folded into a constant at compile time: each call quantizes only x
    (3 quantizations for the 3 FP8 linears, against 6), with the same result bit for bit."""
    torch.manual_seed(0)
    model = MLP().to(torch.bfloat16)
    results = frozen_and_not(model, torch.randn(2, 8, 64, dtype=torch.bfloat16), recipe)
    assert results[False][1] == 6 and results[True][1] == 3
    for got, want in zip(results[True][0], results[False][0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.skipif(DEVICE == "cuda", reason="traced into the graph on the GPU: system/test_gpu.py reads its code")
def test_frozen_inference_of_random_stacks_of_linears():
    """Property: any stack of FP8 linears (random widths, biases, recipe, dtype, rows) compiled for inference under
    freezing quantizes one operand per linear per call, W's folded away, and equals the unfrozen compile bit for bit.
    CI runs a few examples; TURBO_FUZZ_EXAMPLES=200 runs more."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(
        max_examples=int(os.environ.get("TURBO_FUZZ_EXAMPLES", "4")),
        deadline=None,
        derandomize="TURBO_FUZZ_EXAMPLES" not in os.environ,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(
        widths=st.lists(st.sampled_from([16, 32, 48, 128]), min_size=2, max_size=4),
        biases=st.lists(st.booleans(), min_size=3, max_size=3),
        recipe=st.sampled_from(sorted(RECIPES)),
        dtype=st.sampled_from([torch.float32, torch.bfloat16]),
        rows=st.integers(1, 9),
    )
    def check(widths, biases, recipe, dtype, rows):
        torch.manual_seed(0)
        layers = [nn.Linear(i, o, bias=b) for i, o, b in zip(widths, widths[1:], biases)]
        model = nn.Sequential(*(m for layer in layers for m in (layer, nn.GELU()))).to(dtype)
        results = frozen_and_not(model, torch.randn(rows, widths[0], dtype=dtype), recipe)
        assert results[False][1] == 2 * len(layers) and results[True][1] == len(layers)
        assert torch.equal(results[True][0], results[False][0])

    check()


def test_frozen_inference_runs_without_the_high_precision_weights():
    """With freezing_discard_parameters, Inductor erases the module's parameters: the compiled graph, which reads
    only W's FP8 copy, still gives the unfrozen result."""
    torch.manual_seed(0)
    model, x = MLP().to(DEVICE, torch.bfloat16), torch.randn(2, 8, 64, device=DEVICE, dtype=torch.bfloat16)
    want = frozen_and_not(model, x, "rowwise")[False][0]
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="primus_turbo", options={"fp8": "rowwise"})
    with torch.no_grad(), torch._inductor.config.patch(freezing=True, freezing_discard_parameters=True):
        compiled(x)
        got = compiled(x)
    assert type(model.up.weight).__name__ == "ErasedTensor"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_option_save_weight_t_false_keeps_no_weight_copy_for_the_backward(recipe):
    """``options={"fp8": {"recipe": ..., "save_weight_t": False}}``: every FP8 linear of the compiled model keeps
    no quantized W^T from its forward to its backward (what it saves is smaller by a byte per weight), and the
    outputs and weight gradients are those of the default, bit for bit. (Where the ops trace into the graph, GPU, the
    backward then holds W itself instead: a parameter, no memory of its own.)"""
    torch.manual_seed(0)
    model, x = MLP().to(DEVICE), torch.randn(2, 8, 64, device=DEVICE)
    results, saved_bytes = {}, {}
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for save in (True, False):
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        compiled = torch.compile(
            model,
            backend="primus_turbo",
            options={"fp8": {"recipe": recipe, "save_weight_t": save}, "impl": EXACT_IMPL, "record_graphs": True},
        )
        compiled(x.clone().requires_grad_())[0].sum().backward()  # compiles: fake tensors have no storage to hook
        model.zero_grad()
        storages = {}

        def pack(t):  # what the graph holds for its backward beyond the parameters themselves
            if t.untyped_storage().data_ptr() not in parameters:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outs = compiled(x.clone().requires_grad_())
        sum(o.float().square().sum() for o in outs).backward()
        assert turbo_inductor.rewrite_counts()["fp8"] == 3
        # save_weight_t False is written as the op's last argument; True, its default, is left out
        graph_after = turbo_inductor.compile_records()[0].graph_after
        assert bool(re.search(r"fp8_linear\.default\([^)]*, False\)", graph_after)) is not save
        results[save] = [o.detach() for o in outs] + [p.grad.clone() for p in model.parameters()]
        saved_bytes[save] = sum(storages.values())
    for got, want in zip(results[False], results[True]):
        # outputs and weight gradients: the FP8 GEMMs' results, whose operands are bit-identical. Bias gradients
        # are row sums that Inductor fuses and orders differently around W^T's quantization where the ops trace
        # into the graph (GPU): equal to fp32's tolerance there.
        if got.dim() > 1 or DEVICE == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want)
    weights = sum(m.weight.numel() for m in (model.up, model.down, model.head))  # the FP8 linears'
    assert saved_bytes[True] - saved_bytes[False] >= weights, (saved_bytes, weights)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_save_weight_t_auto_keeps_w_t_for_concatenated_linears_and_experts_only(recipe):
    """The default, ``"auto"``: a linear keeps no W^T (its backward quantizes it from W) unless ``fp8_concat`` joins
    it, whose backward would otherwise hold the concatenated W; MoE experts keep theirs. An explicit choice holds.
    Three linears on one norm, the first with a bias: the other two concatenate, except under tensorwise."""
    config = FP8Config.from_option(recipe)
    assert config.save_weight_t == "auto" and not config.saves_weight_t()
    assert config.saves_weight_t(experts=True) and config.saves_weight_t(concatenated=True)
    for save in (True, False):
        explicit = FP8Config.from_option({"recipe": recipe, "save_weight_t": save})
        assert explicit.saves_weight_t() is explicit.saves_weight_t(experts=True, concatenated=True) is save
    gm, _ = capture(Readers([128, 128, 128], biases=[True, False, False]), torch.randn(2, 8, 64), True, False)
    record = rewrite(gm, {"fp8": recipe, "impl": "reference"})
    assert record.counts["fp8_concat"] == (recipe != "tensorwise")
    linears = [linear for node in gm.graph.nodes if (linear := FP8LinearNode.of(node)) is not None]
    concatenated = [ir.fake(linear.weight).shape[0] == 256 for linear in linears]
    assert len(linears) == 3 - record.counts["fp8_concat"]
    assert [linear.save_weight_t for linear in linears] == concatenated


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_rewrite_turns_every_eligible_linear_into_fp8(recipe):
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(2, 8, 64)
    outs, grads = run(model, [x], "primus_turbo", options={"fp8": recipe, "impl": "reference"})
    assert turbo_inductor.rewrite_counts()["fp8"] == 3
    assert ops_after("turbo_inductor.fp8_linear") == 3 and ops_after("linear") == 1
    # one FP8 GEMM forward and two backward per linear (wgrad in high precision: one)
    assert_ran("fp8_gemm", 3 * (2 if RECIPES[recipe].high_precision_wgrad else 3))
    twin = fp8_twin(model, recipe)
    xt = x.clone().requires_grad_()
    expected = twin(xt)
    for got, want in zip(outs, expected):
        torch.testing.assert_close(got, want.detach(), rtol=1e-4, atol=1e-4)
    high = run(model, [x], "inductor")
    assert len(outs) == len(high[0]) and len(grads) == len(high[1])
    # The FP8 gate is 25 dB per GEMM; noise powers add along a chain, so n GEMMs in series are held to
    # 25 - 10 log10(n) dB: head's output follows 3 FP8 GEMMs (up, down, head), odd's follows 2.
    for out, ref, chained in zip(outs, high[0], (3, 2)):
        assert snr_db(out, ref) >= 25 - 10 * math.log10(chained)
    assert all(snr_db(a, b) >= 20 for a, b in zip(grads, high[1]))  # and gradients


def test_a_growing_batch_recompiles_once_as_inductor_does():
    """The whole-tensor blocks take no side on rows <= columns: no guard, no third compile past the in-features."""
    torch._dynamo.reset()
    compiled = torch.compile(
        nn.Linear(64, 32), backend="primus_turbo", options={"fp8": "tensorwise", "impl": "reference"}
    )
    turbo_inductor.reset_records()
    for rows in (4, 48, 80):  # below and above the 64 in-features
        compiled(torch.randn(rows, 64, requires_grad=True)).sum().backward()
    assert len(turbo_inductor.compile_records()) == 2 and turbo_inductor.rewrite_counts()["fp8"] == 2


def test_options_exclude_and_min_size_keep_layers_in_high_precision():
    model, x = MLP(), torch.randn(2, 8, 64)
    run(model, [x], "primus_turbo", options={"fp8": {"recipe": "rowwise", "exclude": r"^head\."}, "impl": "reference"})
    assert turbo_inductor.rewrite_counts()["fp8"] == 2
    turbo_inductor.reset_records()
    # weights: up [128, 64], down [64, 128], head [32, 64]: head has a dimension below 64
    run(model, [x], "primus_turbo", options={"fp8": {"recipe": "rowwise", "min_size": 64}, "impl": "reference"})
    assert turbo_inductor.rewrite_counts()["fp8"] == 2


def test_off_by_default_and_bad_recipes_are_named():
    run(MLP(), [torch.randn(2, 8, 64)], "primus_turbo")
    assert "fp8" not in turbo_inductor.rewrite_counts(), "the pass does not even run"
    assert ops_after("turbo_inductor.fp8_linear") == 0
    with pytest.raises(Exception, match="option 'fp8' takes one of"):
        run(MLP(), [torch.randn(2, 8, 64)], "primus_turbo", options={"fp8": "int4"})
    with pytest.raises(Exception, match="option 'fp8.save_weight_t' takes true, false or 'auto', got 'maybe'"):
        run(
            MLP(),
            [torch.randn(2, 8, 64)],
            "primus_turbo",
            options={"fp8": {"recipe": "rowwise", "save_weight_t": "maybe"}},
        )


@functools.cache
def _inductor_loss_curve() -> torch.Tensor:
    """The high-precision curve every recipe's is compared with: computed once."""
    from turbo_inductor.testing.convergence import loss_curve

    return loss_curve("inductor")


# A scale per tensor, per row, per 1x32 block in powers of two: every recipe's one-step gradients are at the gates in
# test_rewrite_turns_every_eligible_linear_into_fp8.
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "mxfp8"])
def test_training_follows_the_high_precision_loss_curve(recipe):
    """50 AdamW steps of a tiny Llama-style decoder on a fixed regression task, same seed and data."""
    from turbo_inductor.testing.convergence import loss_curve, max_deviation

    base = _inductor_loss_curve()
    fp8 = loss_curve("primus_turbo", {"fp8": recipe, "impl": "reference"})
    assert turbo_inductor.rewrite_counts()["fp8"] == 2 * 4  # qkv, o, gate_up, down per layer
    assert base[-1] < 0.9 * base[0], "the task is learnable"
    # documented tolerance (README): every step within 2% of the high-precision loss
    deviation = max_deviation(fp8, base)
    assert deviation < 0.02, (deviation, base.tolist(), fp8.tolist())


class MatmulSpellings(nn.Module):
    """Linears written as matmuls: against W [N, K] transposed three ways, and against V [K, N] directly."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64) * 0.1)
        self.v = nn.Parameter(torch.randn(64, 32) * 0.1)
        self.odd = nn.Parameter(torch.randn(64, 20) * 0.1)  # 20 outputs: not an FP8 GEMM shape

    def forward(self, x):
        y = x @ self.w.t() + x @ self.w.T + torch.matmul(x, self.w.transpose(0, 1)) + x.matmul(self.v)
        return y, x @ self.odd, x.unsqueeze(1) @ self.w.t().expand(2, 64, 32).unsqueeze(1)


def test_matmul_spellings_become_fp8_linears_and_train():
    torch.manual_seed(0)
    model, x = MatmulSpellings(), torch.randn(2, 8, 64)
    outs, grads = run(model, [x], "primus_turbo", options={"fp8": "rowwise", "impl": "reference"})
    # not the odd shape, not the batched matmul; the four read one x: one FP8 linear over their weights concatenated
    assert sum(record.replaced["fp8"] for record in turbo_inductor.compile_records()) == 4
    assert turbo_inductor.rewrite_counts()["fp8_concat"] == 1
    xt = x.clone().requires_grad_()
    lin = lambda t, weight: turbo_inductor.ops.fp8_linear(t, weight, None, "rowwise", impl="reference")  # noqa: E731
    y = lin(xt, model.w) + lin(xt, model.w) + lin(xt, model.w) + lin(xt, model.v.t())
    torch.testing.assert_close(outs[0], y.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[1], (x @ model.odd).detach(), rtol=1e-5, atol=1e-5)
    high = run(model, [x], "inductor")
    assert len(grads) == len(high[1])
    for got, want in zip(grads, high[1]):  # every gradient within the FP8 gate of the high-precision one
        assert snr_db(got, want) >= 20
