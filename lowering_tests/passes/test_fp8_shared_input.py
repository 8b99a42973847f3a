"""The fp8_shared_input pass: FP8 linears reading one x that stay separate (tensorwise q/k/v and gate/up) share
one quantization of x and x^T, with results equal bit for bit to each linear quantizing its own, in training and
inference; where it declines, and why."""

import copy
import logging
import math

import pytest
import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import (
    assert_ran,
    declines,
    kernel_calls,
    ops_after,
    rewrites_without_compiling,
    run,
)
from turbo_inductor.testing.fp8 import Readers, block, rewritten_run
from turbo_inductor.testing.tolerance import snr_db

# Triton's CPU interpreter rounds ~2% of fp8 stores wrongly: the reference kernels on CPU.
IMPL = {"impl": "reference"} if DEVICE == "cpu" else {}
TENSORWISE = {"fp8": "tensorwise", **IMPL}
SEPARATE = {**TENSORWISE, "fp8_shared_input": False}


def _assert_equal(got, want):
    """Bit for bit on CPU. On the GPU the two graphs may fuse the casts and sums around the linears differently."""
    for g, w in zip(got[0] + got[1], want[0] + want[1], strict=True):
        if w is None:
            assert g is None
        elif DEVICE == "cpu":
            assert torch.equal(g, w)
        else:
            assert snr_db(g, w) >= 30


@pytest.mark.parametrize("train", [True, False], ids=["training", "inference"])
def test_qkv_and_gate_up_quantize_x_once(train):
    """The block's q/k/v and gate/up read one quantization of their x each: 3 fewer x quantizations a call (two of
    q/k/v's, one of gate/up's), x^T included in training. Outputs and gradients as each linear quantizing its own,
    and within the FP8 gates of Inductor's in bf16."""
    model, x = block()
    counts = {}
    for options in (SEPARATE, TENSORWISE):
        turbo_inductor.reset_kernel_calls()
        turbo_inductor.reset_records()
        results = run(model, [x], "primus_turbo", train, options=options)
        counts[options.get("fp8_shared_input", True)] = kernel_calls("fp8_quantize")
        if options is SEPARATE:
            separate = results
    assert {k: v for k, v in turbo_inductor.rewrite_counts().items() if v} == {
        "fp8": 7,
        "rmsnorm": 2,
        "glu": 1,
        "fp8_shared_input": 2,
    }
    assert ops_after("turbo_inductor.fp8_shared_input") == 2
    # 7 linears: x (and x^T, one call) and W each; in training the 7 dy too, and W^T cast again by W's scale
    # (tensorwise keeps no W^T)
    assert_ran("fp8_quantize", 7 * 2 + 14 * train - 3)
    if DEVICE == "cpu":
        assert counts[False] - counts[True] == 3
    _assert_equal(results, separate)
    inductor = run(copy.deepcopy(model).to(torch.bfloat16), [x.to(torch.bfloat16)], "inductor", train)
    assert snr_db(results[0][0], inductor[0][0]) >= 25
    # e5m2 gradients: 20 dB for one FP8 GEMM (o's and down's dW: their dy is the cotangent; 22.9 and 21.3 dB
    # measured). The others follow two, o's or down's dgrad then their own, whose noise powers add: 20 - 10 log10(2)
    # dB, as passes/test_fp8_linear.py chains its gates (19.9 dB for k's dW to 22.2; x's 32.4). A wrong x^T is near
    # 0 dB.
    names = ["x"] + [name for name, _ in model.named_parameters()] if train else []
    for name, got, want in zip(names, results[1], inductor[1], strict=True):
        gate = 20 if name in ("o.weight", "down.weight") else 20 - 10 * math.log10(2)
        assert snr_db(got, want) >= gate, (name, snr_db(got, want))


def test_autocast_and_dynamic_shapes():
    """Under autocast each linear reads its own bf16 cast of x: one x. The weights stay fp32 (the FP8 linears
    quantize them from fp32); the shared quantization reads them all. The graph after the passes runs eagerly
    (nothing compiled)."""
    model, x = block(bias=True)
    with torch.autocast(DEVICE, torch.bfloat16):
        shared, _, record = rewritten_run(model, x, TENSORWISE, True, True)
        separate, _, _ = rewritten_run(model, x, SEPARATE, True, True)
    assert (record.counts["fp8"], record.counts["fp8_shared_input"]) == (7, 2)
    _assert_equal(shared, separate)


@pytest.mark.parametrize(
    "options, readers, shared, said",
    [
        (TENSORWISE, {"rows": [64, 32, 32], "biases": [True, False, True]}, 1, None),
        ({"fp8": {"recipe": "rowwise", "save_weight_t": False}}, {"rows": [64, 32]}, 0, None),
        (TENSORWISE, {"rows": [64, 32], "written": True}, 0, "x or a weight is written in place"),
        (TENSORWISE, {"rows": [64, 32], "derived": True}, 0, "a later linear's weight is computed after the first"),
    ],
    ids=["biases", "rowwise: the norm writes x", "x written in place", "weight after the first"],
)
def test_where_it_fires_and_why_it_declines(options, readers, shared, said, caplog):
    """Biases need not agree, as nothing but x is shared. A norm that writes x in FP8 (rowwise) leaves nothing to
    share. The reason for a decline is logged at DEBUG (``said``; None: no site left alone)."""
    model, x = Readers(**readers).to(DEVICE), torch.randn(3, 64, device=DEVICE)
    with caplog.at_level(logging.DEBUG, logger="turbo_inductor"):
        counts = rewrites_without_compiling(model, [x], options=options)
    assert counts["fp8_shared_input"] == shared
    lines = declines(caplog, "fp8_shared_input")
    assert any(said in line for line in lines) if said is not None else lines == [], lines


class TwoReaders(nn.Module):
    """Two linears on the model's input (no norm to write x in FP8), the first one's weight frozen where asked."""

    def __init__(self, frozen: bool):
        super().__init__()
        self.a, self.b = nn.Linear(64, 32, bias=False), nn.Linear(64, 48, bias=False)
        self.a.weight.requires_grad_(not frozen)

    def forward(self, x):
        return self.a(x), self.b(x)


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "first weight frozen"])
def test_readers_of_a_model_input(recipe, frozen):
    """With no producer, any recipe shares x where its linears stay separate (rowwise with ``save_weight_t=False``).
    A frozen reader takes no x^T; the other's wgrad reads the shared one."""
    torch.manual_seed(0)
    model, x = TwoReaders(frozen).to(DEVICE), torch.randn(4, 64, device=DEVICE)
    options = {"fp8": {"recipe": recipe, "save_weight_t": False}, **IMPL}
    shared = run(model, [x], "primus_turbo", options=options)
    assert turbo_inductor.rewrite_counts()["fp8_shared_input"] == 1
    separate = run(model, [x], "primus_turbo", options={**options, "fp8_shared_input": False})
    assert (shared[1][1] is None) == frozen  # x, a.weight, b.weight
    _assert_equal(shared, separate)


def test_off_leaves_each_linear_its_own_quantization():
    model, x = block()
    counts = rewrites_without_compiling(model, [x], options=SEPARATE)
    assert counts["fp8"] == 7 and "fp8_shared_input" not in counts
