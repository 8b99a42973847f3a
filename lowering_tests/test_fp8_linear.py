"""FP8 linear: the op against fp32 math at the SNR gates, the rewrite of an unmodified model's linears, and a
short training run that follows the high-precision loss curve."""

import copy
import functools
import math
import os
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from compare import assert_left_alone, assert_ran, frozen_and_not, kernel_calls, ops_after, run, snr_db
from conftest import DEVICE

import turbo_inductor
from turbo_inductor.ops.fp8_linear import quantize_weight
from turbo_inductor.recipes import RECIPES

GRADIENT_GATE = {"e4m3": 25.0, "e5m2": 20.0}  # the FP8 gates (docs/fp8.md): SNR in dB by gradient format
# Triton's CPU interpreter rounds ~2% of fp8 stores wrongly: the SNR gates are checked with the reference kernels
# on CPU and with the default (fastest) ones on the GPU.
EXACT_IMPL = "auto" if DEVICE == "cuda" else "reference"


def make(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype).requires_grad_()


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_meets_the_snr_gates_forward_and_backward(recipe, dtype):
    x, w, b = make(3, 48, 256, dtype=dtype), make(128, 256, dtype=dtype, scale=0.05), make(128, dtype=dtype)
    y = turbo_inductor.ops.fp8_linear(x, w, b, recipe, impl=EXACT_IMPL)
    dy = torch.randn_like(y)
    y.backward(dy)
    x32, w32, b32 = (t.detach().float().requires_grad_() for t in (x, w, b))
    ref = F.linear(x32, w32, b32)
    ref.backward(dy.float())
    gate = GRADIENT_GATE[RECIPES[recipe].gradient_format]
    assert y.dtype == dtype and y.shape == (3, 48, 128)
    assert snr_db(y, ref) >= 25
    assert snr_db(x.grad, x32.grad) >= gate
    assert snr_db(w.grad, w32.grad) >= (40 if RECIPES[recipe].high_precision_wgrad else gate)
    torch.testing.assert_close(b.grad.float(), b32.grad, rtol=2e-2, atol=2e-2 * b32.grad.abs().max().item())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_opcheck(recipe):
    x, w, b = make(2, 16, 64), make(32, 64), make(32)
    # opcheck's schema test compares tensors before/after, and its AOT test sums every output, with ops that have
    # no fp8 kernel on CPU: where an op takes (returns) fp8 tensors, skip only that test (those tests). The public
    # op, over fp8_linear_fwd, gets every test, AOT autograd included.
    torch.library.opcheck(torch.ops.turbo_inductor.fp8_linear, (x, w, b, recipe, "reference"))
    no_schema = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    fwd = torch.ops.turbo_inductor.fp8_linear_fwd
    torch.library.opcheck(fwd, (x, w, b, recipe, "reference"), test_utils=no_schema[:2])
    # x^T and W^T come quantized from the forward; x itself only for a high-precision wgrad
    saved = fwd(x.detach(), w.detach(), b.detach(), recipe, "reference")[1:]
    x_saved = x.detach() if RECIPES[recipe].high_precision_wgrad else None
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_bwd,
        (torch.randn(2, 16, 32, device=DEVICE), x_saved, w.detach(), *saved, recipe, "reference"),
        test_utils=no_schema,
    )
    # a weight that wants no gradient: no x^T saved, an empty dweight
    torch.library.opcheck(fwd, (x, w.detach(), b, recipe, "reference", None, None, False), test_utils=no_schema[:2])
    saved = fwd(x.detach(), w.detach(), b.detach(), recipe, "reference", None, None, False)[1:]
    assert saved[0].dim() == 1
    dx, dweight = torch.ops.turbo_inductor.fp8_linear_bwd(
        torch.randn(2, 16, 32, device=DEVICE), None, w.detach(), *saved, recipe, "reference"
    )
    assert dx.shape == x.shape and dweight.shape == (0,)
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_bwd,
        (torch.randn(2, 16, 32, device=DEVICE), None, w.detach(), *saved, recipe, "reference"),
        test_utils=no_schema,
    )
    # no W^T saved (save_weight_t False): the backward quantizes it from W
    torch.library.opcheck(fwd, (x, w, b, recipe, "reference", None, None, True, False), test_utils=no_schema[:2])
    saved = fwd(x.detach(), w.detach(), b.detach(), recipe, "reference", None, None, True, False)[1:]
    assert saved[2].dim() == 1
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_bwd,
        (torch.randn(2, 16, 32, device=DEVICE), x_saved, w.detach(), *saved, recipe, "reference"),
        test_utils=no_schema,
    )
    torch.library.opcheck(torch.ops.turbo_inductor.fp8_linear, (x, w, b, recipe, "reference", None, None, False))
    q = torch.ops.turbo_inductor.fp8_quantize(x.detach()[0], torch.float8_e4m3fn, 1, 64, False, False, "reference")
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_quantize, (x.detach()[0], torch.float8_e4m3fn, 1, 64, True, False, "reference")
    )
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_gemm, (q[0], q[1], q[0], q[1], torch.float32, "reference"), test_utils=no_schema
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: turbo_inductor.ops.fp8_linear(make(4, 64), make(32, 64), None, "fp4"), "recipe must be one of"),
        (lambda: turbo_inductor.ops.fp8_linear(make(4, 64), make(30, 64)), "multiples of 16"),
        (lambda: turbo_inductor.ops.fp8_linear(make(4, 64), make(32, 48)), "K = x.shape"),
        (lambda: turbo_inductor.ops.fp8_linear(make(4, 64), make(32, 64), make(31)), "bias must be"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


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


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_under_autocast_every_linear_becomes_fp8_in_the_autocast_dtype(recipe):
    """fp32 parameters trained under torch.autocast(bfloat16), as mixed-precision training runs: each linear computes
    in bf16 whatever its operands' dtypes (x fp32 or bf16, W fp32), so each becomes an FP8 linear on its operands
    cast to bf16, as autocast casts them: the results are those of the model cast to bf16 (ReLU, which autocast
    leaves alone, between the linears), with bf16 outputs as under Inductor and fp32 gradients for fp32 tensors.
    On CPU the output is equal bit for bit and the gradients within a bf16 rounding, which the bf16 model's
    gradients take and Inductor's fused cast back to fp32 may skip; on the GPU at the FP8 noise level (below)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64, bias=False), nn.Linear(64, 32)).to(DEVICE)
    x = torch.randn(2, 8, 64, device=DEVICE)
    options = {"fp8": recipe, "impl": EXACT_IMPL}
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        (out,), grads = run(model, [x], "primus_turbo", options=options)
        assert turbo_inductor.rewrite_counts()["fp8"] == 3  # x fp32 for the first, bf16 for the others
        assert run(model, [x], "inductor")[0][0].dtype == out.dtype == torch.bfloat16
    assert all(g.dtype == torch.float32 for g in grads)
    (want,), want_grads = run(
        copy.deepcopy(model).to(torch.bfloat16), [x.to(torch.bfloat16)], "primus_turbo", options=options
    )
    if DEVICE == "cuda":
        # Two different GPU graphs: a last-bit difference anywhere (cuBLASLt's kernel choice for other buffers,
        # Inductor's fusions around the casts) moves an amax, and with it the FP8 rounding of a whole row or tensor:
        # the same computation at the FP8 noise level.
        assert snr_db(out, want) >= 30
        for got, expected in zip(grads, want_grads):
            assert snr_db(got, expected) >= GRADIENT_GATE[RECIPES[recipe].gradient_format]
        return
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected.float(), rtol=2**-8, atol=0)


@pytest.mark.skipif(DEVICE == "cuda", reason="traced into the graph on the GPU: test_gpu.py reads its code")
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


@pytest.mark.skipif(DEVICE == "cuda", reason="traced into the graph on the GPU: test_gpu.py reads its code")
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


def test_quantized_weight_gives_the_same_forward():
    x, w, b = make(4, 64, dtype=torch.bfloat16), make(32, 64, dtype=torch.bfloat16), make(32, dtype=torch.bfloat16)
    inference = torch.ops.turbo_inductor.fp8_linear_inference
    for recipe in sorted(RECIPES):
        w_q, w_scale = quantize_weight(w.detach(), recipe, EXACT_IMPL)
        torch.testing.assert_close(
            inference(x, None, b, recipe, EXACT_IMPL, None, None, w_q, w_scale),
            inference(x, w, b, recipe, EXACT_IMPL),
            rtol=0,
            atol=0,
        )
    # fp8 inputs: the schema test compares them, which fp8 tensors cannot on CPU (as test_opcheck)
    w_q, w_scale = quantize_weight(w.detach(), "rowwise", "reference")
    torch.library.opcheck(
        inference,
        (x, None, b, "rowwise", "reference", None, None, w_q, w_scale),
        test_utils=("test_autograd_registration", "test_faketensor"),
    )


def _quantized_weight(recipe="rowwise", shape=(32, 64)):
    return quantize_weight(torch.randn(*shape, device=DEVICE), recipe, "reference")


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda: (make(32, 64), *_quantized_weight()), "one of them, got both"),
        (lambda: (None, None, None), "one of them, got neither"),
        (lambda: (None, _quantized_weight()[0], None), "w_q and w_scale must be given together"),
        (lambda: (None, _quantized_weight()[0].float(), _quantized_weight()[1]), "w_q must be"),
        (lambda: (None, *_quantized_weight(shape=(32, 48))), "w_q must be"),
        (lambda: (None, *_quantized_weight("blockwise")), "w_scale must be the rowwise scales of w"),
        (lambda: (None, *_quantized_weight(shape=(24, 64))), "multiples of 16"),
    ],
)
def test_bad_quantized_weight_is_named(args, message):
    weight, w_q, w_scale = args()
    with pytest.raises(ValueError, match=message):
        torch.ops.turbo_inductor.fp8_linear_inference(
            make(4, 64), weight, None, "rowwise", "reference", None, None, w_q, w_scale
        )


@pytest.mark.parametrize("impl", [EXACT_IMPL] + (["triton"] if DEVICE == "cpu" else []))
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_weight_t_not_saved_is_quantized_again_in_backward(recipe, impl):
    """``save_weight_t=False``: the forward returns no W^T for the backward, which quantizes it from W itself, to
    the same gradients bit for bit."""
    x, w, b = make(3, 16, 64), make(32, 64, scale=0.1), make(32)
    results = {}
    for save in (True, False):
        for t in (x, w, b):
            t.grad = None
        saved = torch.ops.turbo_inductor.fp8_linear_fwd(x, w, b, recipe, impl, None, None, True, save)[1:]
        assert (saved[2].dim(), saved[3].dim()) == ((2, 2) if save else (1, 1))
        y = turbo_inductor.ops.fp8_linear(x, w, b, recipe, impl=impl, save_weight_t=save)
        y.backward(torch.linspace(-1, 1, y.numel(), device=DEVICE).view(y.shape))
        results[save] = y.detach(), x.grad, w.grad, b.grad
    for got, want in zip(results[False], results[True]):
        assert torch.equal(got, want)


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
    with pytest.raises(Exception, match="option 'fp8.save_weight_t' takes true/false, got 'maybe'"):
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


E4M3_MAX = 448.0


class HandQuantized(nn.Module):
    """FP8 inference written by hand, torchao style: dynamic scales (tensorwise, per row: dim -1, or per column:
    dim 0), then torch._scaled_mm accumulating fast."""

    def __init__(self, floor=1e-12, x_dim=None, w_dim=None, fast_accum=True):
        super().__init__()
        self.floor, self.x_dim, self.w_dim, self.fast_accum = floor, x_dim, w_dim, fast_accum
        self.w = nn.Parameter(torch.randn(48, 64, dtype=torch.bfloat16) * 0.05)

    def scale(self, t, dim):
        amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
        return amax.float().clamp(min=self.floor) / E4M3_MAX

    def forward(self, x):
        sx, sw = self.scale(x, self.x_dim), self.scale(self.w, self.w_dim)
        x8 = (x.float() / sx).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        w8 = (self.w.float() / sw).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return torch._scaled_mm(
            x8,
            w8.t(),
            scale_a=sx,
            scale_b=sw if self.w_dim is None else sw.t(),
            out_dtype=torch.bfloat16,
            use_fast_accum=self.fast_accum,
        )


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's torch._scaled_mm; the GPU's is the vendor path")
@pytest.mark.parametrize("dim", [None, -1], ids=["tensorwise", "rowwise"])
def test_hand_quantized_scaled_mm_runs_on_our_quantization(dim):
    model, x = HandQuantized(x_dim=dim, w_dim=dim), torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = torch.compile(model, backend="inductor")(x)
        torch._dynamo.reset()
        got = torch.compile(model, backend="primus_turbo", options={"impl": "reference", "record_graphs": True})(x)
    assert turbo_inductor.rewrite_counts()["fp8_scaled_mm"] == 1
    record = turbo_inductor.compile_records()[-1]
    assert record.ops_before["torch._scaled_mm"] == 1 and record.ops_after["torch._scaled_mm"] == 0
    assert record.ops_after["Tensor.amax"] == 0 and record.ops_after["Tensor.clamp"] == 0
    assert record.ops_after["turbo_inductor.fp8_linear"] == 1
    assert any(
        f"'{'tensorwise' if dim is None else 'rowwise'}'" in line
        for line in record.graph_after.splitlines()
        if "fp8_linear" in line
    )
    # The same quantization math, but 1/s multiplies where the hand-written code divides by s: the two differ by one
    # fp32 ulp, which moves an fp8 value one step where it lands on a rounding boundary (a few elements in a
    # thousand): the outputs agree well beyond FP8's own error (~30 dB against bf16; 40-50 dB seen), not elementwise.
    assert snr_db(got, want) >= 35


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's torch._scaled_mm; the GPU's is the vendor path")
@pytest.mark.parametrize(
    "variant",
    [
        {"floor": 1e-6},
        {"floor": 1e-6, "x_dim": -1, "w_dim": -1},
        {"fast_accum": False},
        {"x_dim": -1, "w_dim": -1, "fast_accum": False},
    ],
    ids=["tensorwise_other_floor", "rowwise_other_floor", "tensorwise_full_accumulation", "rowwise_full_accumulation"],
)
def test_other_hand_quantization_is_left_alone(variant):
    assert_left_alone(HandQuantized(**variant), [torch.randn(32, 64, dtype=torch.bfloat16)], train=False)
