"""FP8 linears reading one x (q/k/v, gate/up) as one FP8 linear over their concatenated weights: what fires where,
the GEMMs it saves, and results equal to the separate linears' where the concatenation is exact."""

import contextlib
import copy
import logging

import pytest
import torch

import turbo_inductor
from turbo_inductor.recipes import RECIPES
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import (
    assert_ran,
    declines,
    frozen_and_not,
    kernel_calls,
    ops_after,
    rewrites_without_compiling,
    run,
)
from turbo_inductor.testing.fp8 import Readers, block, rewritten_run
from turbo_inductor.testing.tolerance import snr_db

# Triton's CPU interpreter rounds ~2% of fp8 stores wrongly: the reference kernels on CPU.
IMPL = {"impl": "reference"} if DEVICE == "cpu" else {}
ROWWISE = {"fp8": "rowwise", **IMPL}
SEPARATE = {**ROWWISE, "fp8_concat": False}


def _assert_same_linears(got, want, names):
    """Outputs and every linear's weight and bias gradient as the separate linears compute them: the forward and dW
    are exact. dx and the norms' gradients it feeds at the FP8 noise level: dgrad quantizes dy and W^T along the
    concatenated N. On the GPU a last-bit difference (another GEMM kernel for another N) may flip an FP8 rounding
    downstream: there all at the FP8 noise level. ``names``: the gradients'."""
    exact = [True] * len(want[0]) + [("weight" in n or "bias" in n) and "norm" not in n for n in names]
    for i, (g, w) in enumerate(zip(got[0] + got[1], want[0] + want[1], strict=True)):
        if DEVICE == "cpu" and exact[i]:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item())
        else:
            assert snr_db(g, w) >= 25, i


def test_qkv_and_gate_up_each_run_one_gemm_as_the_separate_linears_compute():
    """Two concatenations, each fed by its norm's FP8 output (the SwiGLU then reads gate and up as halves of one
    tensor): 4 FP8 GEMMs forward and 8 backward, against 7 and 14. Results as the separate linears' in fp32, and
    within the FP8 gates of Inductor's in bf16."""
    model, x = block()
    compiled = torch.compile(copy.deepcopy(model), backend="primus_turbo", options=ROWWISE)
    out = compiled(x.clone().requires_grad_())
    forward = kernel_calls("fp8_gemm")
    out.backward(torch.randn_like(out))
    assert_ran("fp8_gemm", 4 + 8)  # q/k/v, o, gate/up, down; dgrad and wgrad of each
    if DEVICE == "cpu":  # a GPU counts kernels when their graph compiles (compare.assert_ran)
        assert forward == 4
    assert {k: v for k, v in turbo_inductor.rewrite_counts().items() if v} == {
        "fp8": 2,  # o, down
        "fp8_concat": 2,
        "rmsnorm_fp8": 2,
        "glu_fp8": 1,
    }
    assert ops_after("turbo_inductor.fp8_linear") == 4 and ops_after("turbo_inductor.rmsnorm_fp8") == 2
    concatenated = run(model, [x], "primus_turbo", options=ROWWISE)
    turbo_inductor.reset_records()
    separate = run(model, [x], "primus_turbo", options=SEPARATE)
    assert turbo_inductor.rewrite_counts()["fp8"] == 7 and "fp8_concat" not in turbo_inductor.rewrite_counts()
    assert ops_after("aten.cat") == 0
    _assert_same_linears(concatenated, separate, ["x"] + [name for name, _ in model.named_parameters()])
    inductor = run(copy.deepcopy(model).to(torch.bfloat16), [x.to(torch.bfloat16)], "inductor")
    assert snr_db(concatenated[0][0], inductor[0][0]) >= 25
    assert all(snr_db(g, w) >= 20 for g, w in zip(concatenated[1], inductor[1], strict=True))


@pytest.mark.parametrize(
    "bias, autocast, dynamic, train",
    [(True, True, True, True), (False, False, False, False)],
    ids=["biases, autocast, dynamic shapes, training", "inference"],
)
def test_biases_autocast_dynamic_shapes_and_inference(bias, autocast, dynamic, train):
    """Qwen2.5's q/k/v biases concatenate too. Under autocast (fp32 parameters) the bf16 casts of the weights the
    linears read are concatenated, and the norm writes their one bf16 x and its FP8 form. The graph after the passes
    runs eagerly: models/test_hf_llama.py compiles such a graph, dynamic and under autocast."""
    model, x = block(bias=bias)
    with torch.autocast(DEVICE, torch.bfloat16) if autocast else contextlib.nullcontext():
        concatenated, names, record = rewritten_run(model, x, ROWWISE, train, dynamic)
        separate, _, _ = rewritten_run(model, x, SEPARATE, train, dynamic)
    assert (record.counts["fp8"], record.counts["fp8_concat"], record.counts["rmsnorm_fp8"]) == (2, 2, 2)
    assert record.ops_after["aten.cat"] == 2 + bias  # the weights of q/k/v and gate/up, the biases of q/k/v
    _assert_same_linears(concatenated, separate, names)


@pytest.mark.skipif(
    DEVICE == "cuda", reason="traced into the graph on the GPU: kernel calls are counted when compiling"
)
def test_frozen_inference_folds_the_concatenated_weights():
    """Under freezing the weights' cat and its quantization fold into constants: a call quantizes o_proj's input
    alone (the norms and the GLU write the others' FP8 x), against 5 unfrozen; the same result bit for bit."""
    results = frozen_and_not(*block(), "rowwise")
    assert results[True][1] == 1 and results[False][1] == 5
    assert results[True][2]["fp8_concat"] == results[False][2]["fp8_concat"] == 2
    assert torch.equal(results[True][0], results[False][0])


@pytest.mark.parametrize(
    "fp8, readers, counts, said",
    [
        ("tensorwise", {"rows": [64, 32, 32]}, (3, 0), "tensorwise weights of N [64, 32, 32]: a scale would span two"),
        ("blockwise", {"rows": [128, 64]}, (2, 0), "blockwise weights of N [128, 64]"),
        ("blockwise", {"rows": [128, 256]}, (0, 1), None),
        ("mxfp8", {"rows": [48, 32]}, (0, 1), None),
        (
            "rowwise",
            {"rows": [64, 32, 32], "biases": [True, False, False]},
            (1, 1),
            "no other FP8 linear of x has its recipe and bias",
        ),
        ({"recipe": "rowwise", "exclude": r"linears\.0"}, {"rows": [64, 32, 32]}, (0, 1), None),
        ({"recipe": "rowwise", "save_weight_t": False}, {"rows": [64, 32]}, (2, 0), "would hold the concatenated W"),
        ("rowwise", {"rows": [64, 32], "flat": True}, (2, 0), "a view of an output would not hold on a slice"),
        ("rowwise", {"rows": [64, 32], "written": True}, (2, 0), "x or a weight is written in place"),
        ("rowwise", {"rows": [64, 32], "derived": True}, (2, 0), "a later linear's weight is computed after the first"),
    ],
    ids=[
        "tensorwise",
        "blockwise N/128",
        "blockwise",
        "mxfp8",
        "mixed biases",
        "one excluded",
        "W^T not saved",
        "view",
        "x written in place",
        "weight after the first",
    ],
)
def test_where_it_fires_and_why_it_declines(fp8, readers, counts, said, caplog):
    """Exact concatenations only (``Recipe.concatenates_exactly``), of linears agreeing in recipe and bias; the
    others stay separate FP8 linears, the reason logged at DEBUG (``said``; None: no site left alone). ``counts``:
    (fp8, fp8_concat)."""
    model, x = Readers(**readers).to(DEVICE), torch.randn(3, 64, device=DEVICE)
    with caplog.at_level(logging.DEBUG, logger="turbo_inductor"):
        got = rewrites_without_compiling(model, [x], options={"fp8": fp8})
    assert (got["fp8"], got["fp8_concat"]) == counts and ops_after("aten.cat") == counts[1]
    lines = declines(caplog, "fp8_concat")
    assert any(said in line for line in lines) if said is not None else lines == [], lines


def test_off_leaves_the_linears_separate():
    """``"fp8_concat": False``: the block's seven FP8 linears stay, and no cat joins their weights."""
    model, x = block()
    counts = rewrites_without_compiling(model, [x], options={"fp8": "rowwise", "fp8_concat": False})
    assert counts["fp8"] == 7 and "fp8_concat" not in counts and ops_after("aten.cat") == 0


def test_recipes_concatenate_where_no_weight_scale_spans_two_weights():
    exact = [name for name, recipe in RECIPES.items() if recipe.concatenates_exactly([48, 16])]
    assert exact == ["rowwise", "rowwise_pow2", "rowwise_with_gw_hp", "mxfp8"]
    blockwise = RECIPES["blockwise"]
    assert blockwise.concatenates_exactly([128, 384]) and not blockwise.concatenates_exactly([128, 64])


def test_the_backward_holds_no_concatenated_weight():
    """The backward reads W^T quantized, saved by the forward: the concatenated W, made in the graph where the
    parameters are not, is not held from forward to backward."""
    model = Readers([64, 32, 32]).to(DEVICE)
    x = torch.randn(2, 8, 64, device=DEVICE, requires_grad=True)
    compiled = torch.compile(model, backend="primus_turbo", options=ROWWISE)
    compiled(x)[0].sum().backward()  # compiles
    assert turbo_inductor.rewrite_counts()["fp8_concat"] == 1
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in parameters:
            saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = compiled(x)
    sum(o.sum() for o in outs).backward()
    assert saved and ((128, 64), torch.float32) not in saved, saved
