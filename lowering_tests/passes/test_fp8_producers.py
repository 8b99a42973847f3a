"""The rmsnorm_fp8 and glu_fp8 passes: norms and GLUs feeding FP8 linears write their FP8 input, in a
Llama-style decoder in training, inference, frozen inference and under autocast; where not, and why."""

import pytest
import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor.kernels.triton import glu as triton_glu
from turbo_inductor.kernels.triton import rmsnorm as triton_rmsnorm
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_ran, frozen_and_not, ops_after, rewrites_without_compiling, run
from turbo_inductor.testing.tolerance import snr_db


def _decoder():
    """A decoder layer (its input norm, its residual norms and its GLU: every producer site), half the benchmark's
    tiny width: the interpreter quantizes the weights a program per row, which took most of the time at 256. The
    GLU's 256-wide rows still hold two 1 x 128 blocks."""
    from turbo_inductor.testing.llama import LlamaConfig, LlamaDecoder

    torch.manual_seed(0)
    config = LlamaConfig(hidden=128, intermediate=256, heads=4, kv_heads=2, layers=1)
    model = LlamaDecoder(config).to(DEVICE)
    with torch.no_grad():
        for layer in model.layers:  # norm weights that are not all ones
            layer.input_norm.weight.uniform_(0.5, 1.5)
            layer.post_attention_norm.weight.uniform_(0.5, 1.5)
    return model, torch.randn(2, 16, config.hidden, device=DEVICE)


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_decoder_producers_write_fp8_for_their_linears(recipe):
    """Both norms of each layer (the input norm, a residual norm from the second layer on, and the post-attention
    residual norm) write the FP8 input of qkv and gate_up, and the SwiGLU that of down_proj; the final norm feeds no
    linear and stays. The backward runs the norms' and the GLU's own backward kernels. Outputs and gradients equal
    the same compile with both fusions off (:func:`_assert_same`). Rowwise also where the linears keep no W^T for
    their backward (the fusions hand x's FP8 form to linears that carry that keyword), and in inference: the W^T
    quantized again is the one saved and inference's output the forward's, bit for bit, so that one compile with
    the fusions off is the reference of each."""
    model, x = _decoder()
    layers = len(model.layers)
    plain = run(model, [x], "primus_turbo", options={"fp8": recipe, "rmsnorm_fp8": False, "glu_fp8": False})
    assert "rmsnorm_fp8" not in turbo_inductor.rewrite_counts() and "glu_fp8" not in turbo_inductor.rewrite_counts()
    # (train, save_weight_t)
    cases = [(True, True), (True, False), (False, True)] if recipe == "rowwise" else [(True, True)]
    for train, save_weight_t in cases:
        turbo_inductor.reset_records()
        turbo_inductor.reset_kernel_calls()
        options = {"fp8": {"recipe": recipe, "save_weight_t": save_weight_t}}
        outs, grads = run(model, [x], "primus_turbo", train=train, options=options)
        counts = turbo_inductor.rewrite_counts()
        assert counts["rmsnorm_fp8"] == 2 * layers and counts["glu_fp8"] == layers
        assert ops_after("turbo_inductor.rmsnorm_fp8") == 2 * layers and ops_after("turbo_inductor.glu_fp8") == layers
        assert ops_after("turbo_inductor.rmsnorm") + ops_after("turbo_inductor.rmsnorm_residual") == 1
        assert ops_after("turbo_inductor.glu_fused") == 0
        assert_ran("rmsnorm_fwd_fp8", 2 * layers)
        assert_ran("glu_fwd_fp8", layers)
        assert_ran("rmsnorm_bwd", 2 * layers + 1 if train else 0)
        assert_ran("glu_bwd", layers if train else 0)
        _assert_same(outs + grads, plain[0] + (plain[1] if train else []))


@pytest.mark.skipif(
    DEVICE == "cuda", reason="traced into the graph on the GPU: kernel calls are counted when compiling"
)
def test_frozen_decoder_quantizes_only_what_no_producer_wrote():
    """Inference under freezing, the producer fusion on: the weights' quantization is folded when compiling and the
    producers write x for qkv, gate_up and down_proj, so a call quantizes only o_proj's input (the attention's
    output), one per layer; the result equals the unfrozen compile's bit for bit."""
    model, x = _decoder()
    results = frozen_and_not(model, x, "rowwise")
    for freezing, (_, calls, _) in results.items():
        assert calls == len(model.layers) * (1 if freezing else 5)
    assert results[True][2] == results[False][2], "every rewrite fires on the frozen graph as on the unfrozen one"
    assert torch.equal(results[True][0], results[False][0])


def test_under_autocast_the_norms_write_their_linears_bf16_input_and_its_fp8():
    """fp32 parameters under torch.autocast: the norms' fp32 outputs reach their linears through bf16 casts; the norms
    write y as the cast (no cast left for their linears), q for the linears, and take the casts' backward. The
    fusion costs no accuracy: every output and gradient is as close to the bf16 autocast model's as without it, and
    within e4m3's gate of it (not bit for bit: on CPU the compiled reference math rounds its scales its own way)."""
    model, x = _decoder()
    layers = len(model.layers)
    # on CPU the reference kernels: the Triton interpreter's FP8 stores round ~2% of values wrongly
    options = {"fp8": "rowwise", **({"impl": "reference"} if DEVICE == "cpu" else {})}
    with torch.autocast(DEVICE, torch.bfloat16):
        # the bf16 model uncompiled: Inductor's roundings differ from it far below FP8's noise
        bf16 = run(model, [x], "eager")
        fused = run(model, [x], "primus_turbo", options=options)
        counts, casts = turbo_inductor.rewrite_counts(), ops_after("TensorBase.to")
        assert counts["rmsnorm_fp8"] == 2 * layers and counts["rmsnorm_residual"] == 1  # the final norm
        turbo_inductor.reset_records()
        plain = run(model, [x], "primus_turbo", options={**options, "rmsnorm_fp8": False})
    assert ops_after("TensorBase.to") - casts == 2 * layers, "one cast less per fused norm"
    for f, p, b in zip(fused[0] + fused[1], plain[0] + plain[1], bf16[0] + bf16[1]):
        assert f.dtype == p.dtype == b.dtype
        assert snr_db(f, b) >= snr_db(p, b) - 1 and snr_db(f, p) >= 25


def _assert_same(got, want):
    """Bit for bit on CPU (the same kernels quantize the same y); on the GPU, where the fused norm's y may differ from
    the plain kernel's by an ulp (see above) and flip an fp8 rounding, at the FP8 noise level."""
    for g, w in zip(got, want):
        if DEVICE == "cpu":
            assert torch.equal(g, w)
        else:
            assert snr_db(g, w) >= 30


def test_rows_wider_than_the_producers_tile_keep_their_linears_quantization(monkeypatch):
    """Where the producer's kernel would hand the quantization to a pass of its own anyway, the rewrite is not made
    and the linear quantizes x itself. Rowwise needs a whole row's amax: a GLU row spanning several tiles keeps it (a
    second pass over the row measured slower), while blockwise's 1 x 128 blocks fit the tiles and fuse. A norm whose
    rows do not fit its register tile (the chunked kernel) keeps every recipe's."""
    monkeypatch.setattr(triton_glu, "MAX_BLOCK_F", 128)  # the decoder's 256-wide rows span two tiles
    model, x = _decoder()
    layers = len(model.layers)
    # counted: the fused sites compute what test_decoder_producers_write_fp8_for_their_linears' do, and a linear
    # quantizing x itself what its compile with the fusions off does
    counts = rewrites_without_compiling(model, [x], options={"fp8": "rowwise"})
    assert counts["glu_fp8"] == 0 and counts["rmsnorm_fp8"] == 2 * layers
    assert rewrites_without_compiling(model, [x], options={"fp8": "blockwise"})["glu_fp8"] == layers
    monkeypatch.setattr(triton_rmsnorm, "FWD_MAX_FUSED_BYTES", 256)  # 128 fp32 values a row: chunked
    counts = rewrites_without_compiling(model, [x], options={"fp8": "blockwise"})
    assert counts["rmsnorm_fp8"] == 0 and counts["glu_fp8"] == layers


def test_tensorwise_and_plain_linears_are_left_alone():
    """Tensorwise needs the whole tensor's amax before casting: no fusion. A norm whose output feeds an FP8 linear
    and a high-precision one (excluded by name) is fused; the other linear reads y."""
    model, x = _decoder()
    counts = rewrites_without_compiling(model, [x], options={"fp8": "tensorwise"})
    assert counts["fp8"] > 0 and counts["rmsnorm_fp8"] == counts["glu_fp8"] == 0

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.RMSNorm(64, eps=1e-6)
            self.a, self.b = nn.Linear(64, 32, bias=False), nn.Linear(64, 48)

        def forward(self, x):
            h = self.norm(x)
            return self.a(h), self.b(h)

    turbo_inductor.reset_records()
    torch.manual_seed(0)
    twin, inputs = TwoHeads().to(DEVICE), torch.randn(3, 64, device=DEVICE)
    outs, grads = run(twin, [inputs], "primus_turbo", options={"fp8": {"recipe": "rowwise", "exclude": r"^b\."}})
    assert turbo_inductor.rewrite_counts()["rmsnorm_fp8"] == 1 and turbo_inductor.rewrite_counts()["fp8"] == 1
    assert ops_after("linear") == 1
    plain = run(
        twin, [inputs], "primus_turbo", options={"fp8": {"recipe": "rowwise", "exclude": r"^b\."}, "rmsnorm_fp8": False}
    )
    _assert_same(outs + grads, plain[0] + plain[1])
