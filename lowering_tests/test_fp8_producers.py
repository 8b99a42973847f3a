"""RMSNorm and the GLU writing their output in FP8 for the FP8 linears that read it (the quantization fused into its
producer): the kernels against the producer followed by the quantization kernel, the ops (opcheck, gradients, the
linear taking x pre-quantized, bad input), and the rewrites of a Llama-style decoder in training and inference."""

import pytest
import torch
import torch.nn as nn
from compare import assert_ran, frozen_and_not, ops_after, rewrites_without_compiling, run, snr_db
from conftest import DEVICE

import turbo_inductor
from turbo_inductor.kernels import registry
from turbo_inductor.kernels.triton import glu as triton_glu
from turbo_inductor.kernels.triton import interpreting
from turbo_inductor.kernels.triton import rmsnorm as triton_rmsnorm
from turbo_inductor.recipes import ROW_RECIPES

E4M3 = torch.float8_e4m3fn


def _quantize(impl, y, block_cols, power_of_two):
    return registry.implementations("fp8_quantize")[impl].fn(y, E4M3, 1, block_cols, False, power_of_two=power_of_two)


def _norm_then_quantize(impl, x, weight, residual, eps, block_cols, power_of_two):
    y, s_out, rstd = registry.implementations("rmsnorm_fwd")[impl].fn(x, weight, residual, eps)
    return y, s_out, rstd, *_quantize(impl, y, block_cols, power_of_two)


def _fused(impl, *args, **kwargs):
    return registry.implementations("rmsnorm_fwd_fp8")[impl].fn(*args, **kwargs)


def _assert_equal(got, want):
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        assert g.dtype == w.dtype
        if g.dtype == E4M3:
            g, w = g.view(torch.uint8), w.view(torch.uint8)
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


IMPLS = ["reference", "triton"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "block_cols, power_of_two", [(10**6, False), (128, False), (32, True)], ids=["row", "1x128", "1x32_pow2"]
)
@pytest.mark.parametrize("H", [256, 200])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("residual, weight", [(True, True), (False, True), (False, False)])
def test_fused_kernel_equals_the_norm_then_the_quantization(impl, block_cols, power_of_two, H, dtype, residual, weight):
    """Bit for bit (on CPU): the epilogue quantizes y as rounded to its dtype, with the quantization kernel's numerics
    (rows of a width that is not a power of two end in a partial block; 37 rows leave the last row tile partly
    empty)."""
    x = torch.randn(37, H, device=DEVICE, dtype=dtype) * 3
    x[5, 7] = float("nan")  # a NaN stays in its row's block and scale
    r = torch.randn_like(x) if residual else None
    w = torch.randn(H, device=DEVICE, dtype=dtype) if weight else None
    block = min(block_cols, H)
    got = _fused(impl, x, w, r, 1e-5, E4M3, block, power_of_two)
    want = _norm_then_quantize(impl, x, w, r, 1e-5, block, power_of_two)
    if DEVICE == "cuda":
        # Compiled with the epilogue, the row's sum of squares may be reduced in another order: y and rstd are within
        # a few ulps of the plain kernel's, and q and scale are exactly the quantization of the fused kernel's own y.
        for g, w_ in zip(got[:3], want[:3]):
            if w_ is not None:
                torch.testing.assert_close(
                    g, w_, rtol=2**-7 if dtype == torch.bfloat16 else 5e-7, atol=0, equal_nan=True
                )
        want = (*got[:3], *_quantize(impl, got[0], block, power_of_two))
    _assert_equal(got, want)
    assert got[4].shape == (37, -(-H // block)) and torch.isnan(got[4][5, 7 // block])


@pytest.mark.parametrize("case", ["wide rows", "block not a power of two"])
def test_triton_quantizes_after_the_norm_where_its_tile_cannot(case, monkeypatch):
    """Rows wider than one register tile (the norm's chunked kernel) and blocks that are not powers of two: y is
    quantized by the quantization kernel after the norm, with the same result."""
    if case == "wide rows":
        monkeypatch.setattr(triton_rmsnorm, "FWD_MAX_FUSED_BYTES", 256)
        block = 128
    else:
        block = 96
    x = torch.randn(9, 384, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(384, device=DEVICE, dtype=torch.bfloat16)
    _assert_equal(
        _fused("triton", x, w, None, 1e-6, E4M3, block, False),
        _norm_then_quantize("triton", x, w, None, 1e-6, block, False),
    )


GLU_SIZES = [
    (1792, 128, False),  # several chunks of 1 x 128 blocks per row (a chunk is 256 wide)
    (300, 32, True),  # rows narrower than a tile (several rows per tile), a partial last block
    (300, 300, False),  # one block per row, the row in one tile
    (1300, 1300, False),  # one block per row, wider than a tile: the quantization kernel after the GLU
    (300, 96, False),  # not a power of two: likewise
    (2100, 2048, False),  # a block wider than a tile: likewise
]
GLU_FORMS = ["halves", "separate", "moe"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("F, block_cols, power_of_two", GLU_SIZES, ids=lambda v: str(v))
@pytest.mark.parametrize("form", GLU_FORMS)
def test_glu_kernel_equals_the_glu_then_the_quantization(impl, F, block_cols, power_of_two, form, monkeypatch):
    """Bit for bit, GPU included (the GLU is elementwise: no reduction order to differ): gate and up as the halves of
    one tensor (strided rows), as two tensors, and with MoE probs and a row mask (dropped rows: zeros, floor scales).
    The dtype alternates over sizes and forms."""
    size = GLU_SIZES.index((F, block_cols, power_of_two))
    dtype = [torch.bfloat16, torch.float32][(size + GLU_FORMS.index(form)) % 2]
    monkeypatch.setattr(triton_glu, "MAX_BLOCK_F", 1024)  # several chunks per row at test sizes
    monkeypatch.setattr(triton_glu, "MIN_BLOCK_F", 256)
    x = torch.randn(7, 2 * F, device=DEVICE, dtype=dtype) * 3
    gate, up = (x[:, :F], x[:, F:]) if form == "halves" else (x[:, :F].contiguous(), x[:, F:].contiguous())
    probs = torch.rand(7, device=DEVICE) if form == "moe" else None
    mask = torch.tensor([1, 0, 1, 1, 1, 0, 1], device=DEVICE, dtype=torch.bool) if form == "moe" else None
    glu = registry.implementations("glu_fwd")[impl].fn
    got = registry.implementations("glu_fwd_fp8")[impl].fn(
        gate, up, probs, mask, "silu", E4M3, block_cols, power_of_two
    )
    out = glu(gate, up, probs, mask, "silu")
    _assert_equal(got, (out, *_quantize(impl, out, block_cols, power_of_two)))


@pytest.mark.parametrize("recipe", ROW_RECIPES)
@pytest.mark.parametrize("residual", [True, False])
def test_op_gradients_are_rmsnorms_and_the_linear_takes_its_fp8_output(recipe, residual):
    """rmsnorm_fp8's y, sum and gradients equal rmsnorm's / rmsnorm_residual's; an fp8_linear given its q and scale
    computes exactly what it computes from y alone, forward and backward, in training and in inference."""
    x = torch.randn(2, 24, 128, device=DEVICE, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True) if residual else None
    w = torch.randn(128, device=DEVICE, requires_grad=True)
    lin = (torch.randn(64, 128, device=DEVICE) * 0.1).requires_grad_()
    ops = turbo_inductor.ops

    def fused():
        y, total, q, scale = ops.rmsnorm_fp8(x, r, w, 1e-6, recipe, impl="reference")
        out = ops.fp8_linear(y, lin, None, recipe, impl="reference", x_q=q, x_scale=scale)
        return out, (total if residual else None)

    def unfused():
        if residual:
            y, total = ops.rmsnorm_residual(x, r, w, 1e-6, impl="reference")
        else:
            y, total = ops.rmsnorm(x, w, 1e-6, impl="reference"), None
        return ops.fp8_linear(y, lin, None, recipe, impl="reference"), total

    results = []
    for forward in (fused, unfused):
        out, total = forward()
        cotangents = [torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)]
        outputs = [out] + ([total] if residual else [])
        cotangents += (
            [torch.randn(total.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)] if residual else []
        )
        leaves = [t for t in (x, r, w, lin) if t is not None]
        grads = torch.autograd.grad(outputs, leaves, cotangents)
        with torch.no_grad():
            inference = forward()[0]
        results.append([t.detach() for t in outputs] + list(grads) + [inference])
    for got, want in zip(*results):
        assert torch.equal(got, want)


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("form", ["halves", "separate", "moe"])
def test_glu_op_gradients_are_the_glus_and_the_linear_takes_its_fp8_output(recipe, form):
    """glu_fp8's output and gradients equal glu's / glu_fused's, and the down projection given its q and scale
    computes what it computes from the output alone, forward and backward."""
    x = torch.randn(2, 24, 2 * 128, device=DEVICE, requires_grad=True)
    up = torch.randn(2, 24, 128, device=DEVICE, requires_grad=True) if form != "halves" else None
    gate = x[..., :128] if form != "halves" else x
    probs = torch.rand(2, 24, device=DEVICE, requires_grad=True) if form == "moe" else None
    mask = (torch.rand(2, 24, device=DEVICE) > 0.3) if form == "moe" else None
    lin = (torch.randn(64, 128, device=DEVICE) * 0.1).requires_grad_()
    ops = turbo_inductor.ops

    def fused():
        out, q, scale = ops.glu_fp8(gate, up, probs, mask, "silu", recipe, impl="reference")
        return ops.fp8_linear(out, lin, None, recipe, impl="reference", x_q=q, x_scale=scale)

    def unfused():
        if up is None:
            out = ops.glu_fused(gate, "silu", probs, mask, impl="reference")
        else:
            out = torch.ops.turbo_inductor.glu(gate, up, probs, mask, "silu", "reference")
        return ops.fp8_linear(out, lin, None, recipe, impl="reference")

    results = []
    for forward in (fused, unfused):
        y = forward()
        leaves = [t for t in (x, up, probs, lin) if t is not None]
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        grads = torch.autograd.grad(y, leaves, dy)
        results.append([y.detach(), *grads])
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_opcheck():
    x, r = torch.randn(2, 8, 64, device=DEVICE), torch.randn(2, 8, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    # fp8 outputs: opcheck's schema test compares outputs and its AOT test sums them, which fp8 tensors cannot on
    # CPU (as test_fp8_linear's opcheck); the fake and the autograd registration are checked
    fp8_out = ("test_autograd_registration", "test_faketensor")
    for residual in (r, None):
        for recipe in ("rowwise", "blockwise"):
            for out_dtype in (None, torch.bfloat16):
                torch.library.opcheck(
                    torch.ops.turbo_inductor.rmsnorm_fp8_fwd,
                    (x, residual, w, 1e-6, recipe, "reference", out_dtype),
                    test_utils=fp8_out,
                )
    q, scale = turbo_inductor.ops.rmsnorm_fp8(x, None, w, 1e-6, "rowwise", impl="reference")[2:]
    lin = torch.randn(32, 64, device=DEVICE)
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_fwd, (x, lin, None, "rowwise", "reference", q, scale), test_utils=fp8_out
    )
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_inference,
        (x, lin, None, "rowwise", "reference", q, scale),
        test_utils=fp8_out,
    )
    probs, mask = torch.rand(2, 8, device=DEVICE), torch.rand(2, 8, device=DEVICE) > 0.5
    for args in ((x, None, None, None), (x[..., :32], x[..., 32:], probs, mask)):
        for recipe in ("rowwise", "mxfp8"):
            torch.library.opcheck(
                torch.ops.turbo_inductor.glu_fp8, (*args, "silu", recipe, "reference"), test_utils=fp8_out
            )


def _bad(recipe="rowwise", q_shape=(16, 64), q_dtype=E4M3, scale_shape=(16, 1), scale_given=True):
    x, lin = torch.randn(2, 8, 64, device=DEVICE), torch.randn(32, 64, device=DEVICE)
    q = torch.zeros(q_shape, device=DEVICE).to(q_dtype)
    scale = torch.ones(scale_shape, device=DEVICE) if scale_given else None
    return lambda: turbo_inductor.ops.fp8_linear(x, lin, None, recipe, impl="reference", x_q=q, x_scale=scale)


@pytest.mark.parametrize(
    "call, message",
    [
        (_bad(q_shape=(8, 64)), "x_q must be x quantized as \\[16, 64\\]"),
        (_bad(q_dtype=torch.float8_e5m2), "x_q must be x quantized"),
        (_bad(scale_shape=(16, 2)), "x_scale must be the rowwise scales of x, float32 \\[16, 1\\]"),
        (_bad(recipe="mxfp8"), "x_scale must be the mxfp8 scales of x, float32 \\[16, 2\\]"),
        (_bad(scale_given=False), "x_q and x_scale must be given together"),
        (
            lambda: turbo_inductor.ops.rmsnorm_fp8(torch.randn(4, 64, device=DEVICE), None, None, 1e-6, "tensorwise"),
            "recipe must quantize x in blocks within a row",
        ),
        (
            lambda: turbo_inductor.ops.rmsnorm_fp8(
                torch.randn(4, 64, device=DEVICE), torch.randn(4, 32, device=DEVICE), None, 1e-6, "rowwise"
            ),
            "residual",
        ),
        (
            lambda: turbo_inductor.ops.rmsnorm_fp8(torch.randn(4, 64, device=DEVICE), out_dtype=torch.int32),
            "rmsnorm_fp8: out_dtype must be one of float32, bfloat16, float16 or None, got torch.int32",
        ),
        (
            lambda: turbo_inductor.ops.glu_fp8(torch.randn(4, 64, device=DEVICE), recipe="tensorwise"),
            "glu_fp8: recipe must quantize x in blocks within a row",
        ),
        (lambda: turbo_inductor.ops.glu_fp8(torch.randn(4, 63, device=DEVICE)), "it must be even"),
        (
            lambda: turbo_inductor.ops.glu_fp8(torch.randn(4, 64, device=DEVICE), torch.randn(4, 32, device=DEVICE)),
            "up .* must match gate",
        ),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [True, False])
def test_out_dtype_writes_the_norms_output_cast_and_takes_its_gradient(impl, residual):
    """Under autocast an fp32 norm's output is cast to bf16 for its linears: with ``out_dtype`` the norm writes y as
    that cast (one rounding from fp32, as the cast's), q is y's quantization, and the gradients equal those of the
    norm then the cast (the norm's backward reads dy in bf16, as the cast's backward would have converted it)."""
    x = torch.randn(3, 8, 128, device=DEVICE, dtype=torch.bfloat16 if residual else torch.float32, requires_grad=True)
    r = torch.randn(3, 8, 128, device=DEVICE, requires_grad=True) if residual else None
    w = torch.randn(128, device=DEVICE, requires_grad=True)
    y, total, q, scale = turbo_inductor.ops.rmsnorm_fp8(x, r, w, 1e-6, "rowwise", impl=impl, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and (total.dtype == torch.float32 if residual else total.numel() == 0)
    plain = (
        turbo_inductor.ops.rmsnorm_residual(x, r, w, 1e-6, impl=impl)[0]
        if residual
        else turbo_inductor.ops.rmsnorm(x, w, 1e-6, impl=impl)
    )
    want = plain.to(torch.bfloat16)
    if impl == "triton" and interpreting():
        # the interpreter truncates fp32 -> bf16 where the cast rounds: an ulp
        torch.testing.assert_close(y, want, rtol=2**-7, atol=0)
    else:
        assert torch.equal(y, want)
    _assert_equal((q, scale), _quantize(impl, y.reshape(-1, 128), 10**6, False))
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [t for t in (x, r, w) if t is not None], dy)
    want_grads = torch.autograd.grad(want, [t for t in (x, r, w) if t is not None], dy)
    for g, w_ in zip(got, want_grads):
        assert g.dtype == w_.dtype
        torch.testing.assert_close(g, w_, rtol=1e-5, atol=1e-5)


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
