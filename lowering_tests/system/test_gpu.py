"""On the GPU (skipped without CUDA): the kernels at real sizes against float64, Triton against the reference,
and a Llama-style block compiled with primus_turbo against inductor. Run there with
``python -m pytest lowering_tests -q`` (see benchmarks/run_gpu.sh)."""

import importlib
import re

import pytest
import torch

import turbo_inductor
from turbo_inductor.kernels import registry
from turbo_inductor.ops.fp8_operands import fp8_formats
from turbo_inductor.testing.compare import assert_matches_inductor, default_counts
from turbo_inductor.testing.tolerance import assert_close, snr_db

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("shape", [(8192, 4096), (4099, 8192), (16, 16384), (3, 65537)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rmsnorm_at_real_sizes(shape, dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
    y, total = turbo_inductor.ops.rmsnorm_residual(x, r, w, eps=1e-6, impl="triton")
    dy, dtotal = torch.randn_like(y), torch.randn_like(total)
    torch.autograd.backward([y, total], [dy, dtotal])
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    # the sum is x + r as torch adds in x's dtype (fp32 add, one rounding), and that rounded sum is normalized
    rounded = (x.detach() + r.detach()).double() - (x64 + r64).detach()
    s64 = x64 + r64 + rounded
    assert torch.equal(total, x.detach() + r.detach())
    ref = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    torch.autograd.backward([ref, s64], [dy.double(), dtotal.double()])
    assert_close(y, ref, dtype)
    assert_close(x.grad, x64.grad, dtype)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=tol, atol=tol * w64.grad.abs().max().item())


def test_triton_backward_is_deterministic():
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y, rstd = torch.ops.turbo_inductor.rmsnorm_fwd(x, w, 1e-6, "triton")
    dy = torch.randn_like(y)
    first = torch.ops.turbo_inductor.rmsnorm_bwd(dy, x, w, rstd, None, "triton")
    second = torch.ops.turbo_inductor.rmsnorm_bwd(dy, x, w, rstd, None, "triton")
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_triton_matches_reference_implementation():
    x = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    a = torch.ops.turbo_inductor.rmsnorm_fwd(x, w, 1e-6, "triton")
    b = torch.ops.turbo_inductor.rmsnorm_fwd(x, w, 1e-6, "reference")
    torch.testing.assert_close(a[0], b[0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(a[1], b[1], rtol=1e-5, atol=1e-5)


def test_llama_block_on_gpu_matches_inductor():
    from turbo_inductor.testing.llama import LlamaConfig, LlamaDecoder

    config = LlamaConfig(hidden=512, intermediate=1408, heads=8, kv_heads=4, layers=2)
    model = LlamaDecoder(config).to("cuda", torch.bfloat16)
    x = torch.randn(2, 128, 512, device="cuda", dtype=torch.bfloat16)
    counts = assert_matches_inductor(model, [x])
    assert counts == default_counts(rmsnorm=1, rmsnorm_residual=4, glu=2)


def test_compiled_graph_launches_our_kernels_itself():
    """On GPU the ops are traced into the compiled graph: Inductor's generated code launches our Triton kernels in
    forward and backward, and never calls back into a turbo_inductor op at run time."""
    from torch._inductor.utils import run_and_get_code

    from turbo_inductor.testing.llama import LlamaConfig, LlamaDecoder

    config = LlamaConfig(hidden=512, intermediate=1408, heads=8, kv_heads=4, layers=1)
    model = LlamaDecoder(config).to("cuda", torch.bfloat16)
    x = torch.randn(2, 128, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="primus_turbo")
    _, codes = run_and_get_code(lambda: compiled(x).float().square().sum().backward())
    code = "\n".join(codes)
    for kernel in (
        "_rmsnorm_fwd_kernel",
        "_rmsnorm_bwd_kernel",
        "_dw_reduce_kernel",
        "_glu_fwd_kernel",
        "_glu_bwd_kernel",
    ):
        assert kernel in code, f"{kernel} is not launched by the compiled graph"
    assert "torch.ops.turbo_inductor" not in code


def test_a_cold_compile_builds_no_triton_launcher(monkeypatch):
    """Inductor's static launcher starts our kernels too: a cold compile of a block, forward and backward, has the
    host compiler build no Triton launcher, which costs a build per kernel signature (docs/kernels.md, "Launchers")."""
    import triton.backends.nvidia.driver as driver
    from torch._inductor.utils import fresh_inductor_cache

    from turbo_inductor.testing.llama import LlamaConfig, LlamaDecoder

    builds = []
    build = driver.compile_module_from_src

    def counting(src, name, *args, **kwargs):
        builds.append(name)
        return build(src, name, *args, **kwargs)

    monkeypatch.setattr(driver, "compile_module_from_src", counting)
    config = LlamaConfig(hidden=512, intermediate=1408, heads=8, kv_heads=4, layers=1)
    model = LlamaDecoder(config).to("cuda", torch.bfloat16)
    x = torch.randn(2, 128, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.reset()
    with fresh_inductor_cache():
        torch.compile(model, backend="primus_turbo")(x).float().square().sum().backward()
    assert turbo_inductor.rewrite_counts()["glu"] == 1
    assert "__triton_launcher" not in builds


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_compiled_fp8_linear_copies_nothing(recipe):
    """The FP8 linear's quantization kernels are traced into the graph, and Inductor proves which arguments they
    write: no copy of x or W around them (when its analysis gives up, it copies every argument back as written)."""
    from torch._inductor.utils import run_and_get_code

    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x, w: torch.nn.functional.linear(x, w), backend="primus_turbo", options={"fp8": recipe}
    )
    _, codes = run_and_get_code(lambda: compiled(x, w).float().square().sum().backward())
    code = "\n".join(codes)
    launched = sorted(set(re.findall(r"_fp8_\w+_kernel|turbo_inductor\w*\.\w+", code)))
    quantize = registry.implementations("fp8_quantize")
    native = quantize["native"].unavailable_reason(torch.device("cuda")) is None
    assert ("turbo_inductor_native.fp8_quantize" if native else "_fp8_tile_kernel") in launched, launched
    assert "aten.copy_" not in code and "aten.clone" not in code


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_frozen_fp8_linears_read_the_weights_fp8_copy(recipe):
    """Inference under Inductor's freezing: the compiled code quantizes x alone (W's quantization ran when
    compiling, by constant folding), calls back into no op, and gives the unfrozen compile's result bit for bit."""
    from torch._inductor.utils import run_and_get_code

    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512, bias=False))
    model = model.to("cuda", torch.bfloat16)
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    launches = re.compile(r"turbo_inductor_native\.fp8_quantize\.default\(|_fp8_\w+_kernel\w*\.run\(")
    results = {}
    for freezing in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="primus_turbo", options={"fp8": recipe})
        with torch.no_grad(), torch._inductor.config.patch(freezing=freezing):
            out, codes = run_and_get_code(lambda: compiled(x))
        code = "\n".join(codes)
        assert "torch.ops.turbo_inductor." not in code
        results[freezing] = out, len(launches.findall(code))
    assert 0 < results[True][1] < results[False][1], results
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=0)


@pytest.mark.parametrize(
    "block_cols, power_of_two", [(4096, False), (128, False), (32, True)], ids=["rowwise", "1x128", "1x32"]
)
@pytest.mark.parametrize(
    "residual, dtype",
    [(False, torch.bfloat16), (True, torch.bfloat16), (True, torch.float32)],
    ids=["plain", "residual", "autocast"],
)
def test_rmsnorm_fp8_at_real_sizes_equals_the_norm_then_the_quantization(block_cols, power_of_two, residual, dtype):
    """The norm's FP8 epilogue, compiled for the GPU, against the norm followed by the quantization kernel; "autocast":
    an fp32 residual stream with a bf16 branch, the norm's fp32 output written as its cast to bf16."""
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16) * 4
    r = torch.randn_like(x, dtype=dtype) if residual else None
    w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
    e4m3 = fp8_formats(x.device)[0]
    out_dtype = torch.bfloat16 if dtype == torch.float32 else None
    fused = registry.implementations("rmsnorm_fwd_fp8")["triton"].fn(
        x, w, r, 1e-5, e4m3, block_cols, power_of_two, out_dtype=out_dtype
    )
    y, total, rstd = registry.implementations("rmsnorm_fwd")["triton"].fn(x, w, r, 1e-5)
    y = y.to(out_dtype or y.dtype)
    # y and rstd within an ulp of the plain kernel's (compiled with the epilogue, the row sum may be reduced in
    # another order); q and scale exactly the quantization of the fused kernel's own y
    for got, want in zip(fused[:3], (y, total, rstd)):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=2**-7 if want.dtype == torch.bfloat16 else 5e-7, atol=0)
    q, scale = registry.implementations("fp8_quantize")["triton"].fn(
        fused[0], e4m3, 1, block_cols, False, power_of_two=power_of_two
    )
    assert torch.equal(fused[3].view(torch.uint8), q.view(torch.uint8)) and torch.equal(fused[4], scale)


@pytest.mark.parametrize(
    "block_cols, power_of_two", [(14336, False), (128, False), (32, True)], ids=["rowwise", "1x128", "1x32"]
)
def test_glu_fp8_at_real_sizes_equals_the_glu_then_the_quantization(block_cols, power_of_two):
    """The GLU's FP8 epilogue (1 x 128, 1 x 32) and, for rows wider than a tile (rowwise: a row of 14336 spans seven
    tiles), the quantization kernel after it, compiled for the GPU, bit for bit against the GLU then the quantization
    kernel (elementwise: no reduction order to differ)."""
    x = torch.randn(8192, 2 * 14336, device="cuda", dtype=torch.bfloat16) * 3
    gate, up = x[:, :14336], x[:, 14336:]
    e4m3 = fp8_formats(x.device)[0]
    out, q, scale = registry.implementations("glu_fwd_fp8")["triton"].fn(
        gate, up, None, None, "silu", e4m3, block_cols, power_of_two
    )
    want = registry.implementations("glu_fwd")["triton"].fn(gate, up, None, None, "silu")
    want_q, want_scale = registry.implementations("fp8_quantize")["triton"].fn(
        want, e4m3, 1, block_cols, False, power_of_two=power_of_two
    )
    assert torch.equal(out, want) and torch.equal(scale, want_scale)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_compiled_decoder_producers_write_fp8_without_calling_back(recipe):
    """The rmsnorm_fp8 and glu_fp8 rewrites on the GPU: traced into the compiled graph (our norm and GLU kernels
    launched with their FP8 epilogues, no call back into a turbo_inductor op), and the same results as with the
    rewrites off."""
    from torch._inductor.utils import run_and_get_code

    from turbo_inductor.testing.llama import LlamaConfig, LlamaDecoder

    model = LlamaDecoder(LlamaConfig(hidden=512, intermediate=1408, heads=8, kv_heads=4, layers=2)).to(
        "cuda", torch.bfloat16
    )
    x = torch.randn(2, 128, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    results = []
    for fuse in (True, False):
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        compiled = torch.compile(
            model, backend="primus_turbo", options={"fp8": recipe, "rmsnorm_fp8": fuse, "glu_fp8": fuse}
        )
        x.grad = None
        model.zero_grad()
        out, codes = run_and_get_code(lambda: compiled(x))
        out.float().square().sum().backward()
        results.append([out, x.grad, *(p.grad for p in model.parameters())])
        if fuse:
            code = "\n".join(codes)
            counts = turbo_inductor.rewrite_counts()
            assert counts["rmsnorm_fp8"] == 4 and counts["glu_fp8"] == 2
            assert "_rmsnorm_fwd_kernel" in code
            assert "_glu_fwd_kernel" in code
            assert "torch.ops.turbo_inductor." not in code  # (the native kernels are extern calls by design)
    # an ulp of difference in y (see above) flips a few fp8 roundings: equal at the FP8 noise level
    assert all(snr_db(got, want) >= 30 for got, want in zip(*results))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise", "mxfp8"])
def test_fp8_linear_on_gpu_matches_its_emulation(recipe):
    """The vendor GEMM (tensorwise, rowwise) and the Triton quantization against the fp32 emulation, at a real
    shape, forward and backward."""
    x = torch.randn(4099, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    fast = turbo_inductor.ops.fp8_linear(x, w, None, recipe)
    dy = torch.randn_like(fast)
    fast.backward(dy)
    grads = x.grad, w.grad
    x.grad = w.grad = None
    emulated = turbo_inductor.ops.fp8_linear(x, w, None, recipe, impl="fp8_quantize=reference,fp8_gemm=reference")
    emulated.backward(dy)
    torch.testing.assert_close(fast, emulated, rtol=2e-2, atol=2e-2 * emulated.abs().max().item())
    for got, want in zip(grads, (x.grad, w.grad)):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_blockwise_gemms_run_on_cublaslt_eager_and_compiled():
    """On Hopper with CUDA >= 12.9 blockwise's three GEMMs (1x128 x 128x128 forward and dgrad, 1x128 x 1x128 wgrad)
    go through torch._scaled_mm, eager and compiled, matching the emulation; elsewhere they decline to Triton."""
    from turbo_inductor.kernels.vendor import fp8_gemm as vendor_gemm

    x = torch.randn(2, 2048, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    dy = torch.randn(2, 2048, 1024, device="cuda", dtype=torch.bfloat16)

    def step(linear, impl="auto"):
        out = linear(x, w, impl)
        return (out, *torch.autograd.grad(out, (x, w), dy))

    def fp8_linear(x, w, impl):
        return turbo_inductor.ops.fp8_linear(x, w, None, "blockwise", impl=impl)

    turbo_inductor.reset_kernel_calls()
    fast = step(fp8_linear)
    on_vendor = turbo_inductor.kernel_calls().get(("fp8_gemm", "vendor"), 0)
    assert on_vendor == (0 if vendor_gemm.deepseek_unsupported(x.device) else 3)
    for got, want in zip(fast, step(fp8_linear, "fp8_quantize=reference,fp8_gemm=reference")):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x, w, impl: torch.nn.functional.linear(x, w), backend="primus_turbo", options={"fp8": "blockwise"}
    )
    for got, want in zip(step(compiled), fast):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_forward_gemm_accumulates_fast_and_the_backward_ones_in_full(recipe):
    """y is torch._scaled_mm of the quantized x and W with use_fast_accum (torchao's forward too), bit for bit;
    dx = dy W accumulates in full."""
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    y = turbo_inductor.ops.fp8_linear(x, w, None, recipe)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    e4m3, e5m2 = fp8_formats(x.device)
    tensorwise = recipe == "tensorwise"

    def scaled_mm(a, a_format, b, fast_accum):  # a @ b^T, each quantized whole or per row as the recipe says
        (qa, sa), (qb, sb) = (
            torch.ops.turbo_inductor.fp8_quantize(t, fp8, t.shape[0] if tensorwise else 1, t.shape[1])
            for t, fp8 in ((a, a_format), (b, e4m3))
        )
        return torch._scaled_mm(
            qa,
            qb.t(),
            scale_a=sa.reshape(()) if tensorwise else sa,
            scale_b=sb.reshape(()) if tensorwise else sb.reshape(1, -1),
            out_dtype=torch.bfloat16,
            use_fast_accum=fast_accum,
        )

    assert torch.equal(y, scaled_mm(x.detach(), e4m3, w.detach(), True))
    assert torch.equal(dx, scaled_mm(dy, e5m2 if tensorwise else e4m3, w.detach().t().contiguous(), False))


def test_the_experts_dgrad_accumulates_fast_as_accurately_as_in_full(monkeypatch):
    """The FP8 experts' dx = dy W^T in the tensor cores' fast mode (FAST_ACCUM_DGRAD), summed over Mixtral's down
    width (14336): against float64 above the gate and within 0.2 dB of the sums promoted to fp32 per chunk."""
    op_module = importlib.import_module("turbo_inductor.ops.fp8_grouped_mm")  # the ops attribute is the op

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 4096, device="cuda", generator=gen).bfloat16().requires_grad_()
    parameter = (torch.randn(2, 14336, 4096, device="cuda", generator=gen) * 0.02).bfloat16()
    offs = torch.tensor([1536, 4096], device="cuda", dtype=torch.int32)
    dy = torch.randn(4096, 14336, device="cuda", generator=gen).bfloat16()

    def dx():
        y = turbo_inductor.ops.fp8_grouped_mm(x, parameter.transpose(-2, -1), offs, "rowwise")
        return torch.autograd.grad(y, x, dy)[0]

    fast = dx()
    monkeypatch.setattr(op_module, "FAST_ACCUM_DGRAD", False)
    full = dx()
    bounds = [(0, 1536, 0), (1536, 4096, 1)]
    want = torch.cat([dy[a:b].double() @ parameter[g].double() for a, b, g in bounds])
    assert snr_db(fast, want) >= 25 and snr_db(fast, want) >= snr_db(full, want) - 0.2


def test_training_loop_does_not_grow_memory():
    """200 steps of compiled training (AdamW): memory in use after step 10 is memory in use after step 200."""
    from turbo_inductor.testing.llama import LlamaConfig, LlamaDecoder

    model = LlamaDecoder(LlamaConfig(hidden=512, intermediate=1408, heads=8, kv_heads=4, layers=2)).to(
        "cuda", torch.bfloat16
    )
    compiled = torch.compile(model, backend="primus_turbo")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2, 128, 512, device="cuda", dtype=torch.bfloat16)
    for step in range(200):
        optimizer.zero_grad(set_to_none=True)
        compiled(x).float().square().mean().backward()
        optimizer.step()
        if step == 9:
            torch.cuda.synchronize()
            settled = torch.cuda.memory_allocated()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= settled
    assert turbo_inductor.rewrite_counts()["glu"] == 2


@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_triton_fp8_gemm_at_a_real_shape(recipe):
    """The Triton FP8 GEMM (opt-in) against the emulation on the same quantized operands, forward and backward."""
    x = torch.randn(4099, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    results = []
    for gemm in ("triton", "reference"):
        out = turbo_inductor.ops.fp8_linear(x, w, None, recipe, impl=f"fp8_quantize=triton,fp8_gemm={gemm}")
        results.append((out, *torch.autograd.grad(out, (x, w), torch.ones_like(out))))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def assert_same_outputs(got, want) -> None:
    """Each output of the same shape and strides and bit for bit equal (FP8 compared as bytes)."""
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)) if g.element_size() == 1 else torch.equal(g, w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("experts, rows, cols", [(4, 4096, 4096), (2, 4096, 14336), (1, 8192, 4096)])
def test_both_layouts_from_the_row_pass_with_column_maxima_at_real_sizes(dtype, experts, rows, cols):
    """Both layouts with x^T's blocks a column of each expert's rows (or of all rows), the row kernel writing the
    column maxima: bit for bit the reference's two quantizations. Triton 3.6 miscompiled, for this GPU, a kernel
    storing both of x's layouts; this one stores q and the maxima."""
    from turbo_inductor.kernels.reference import fp8_quant as reference_fp8
    from turbo_inductor.kernels.triton import fp8_quant as triton_fp8

    M, e4m3 = experts * rows, fp8_formats(torch.device("cuda"))[0]
    block_cols, block_cols_t = (cols, rows) if experts > 1 else (M + cols + 1, 0)
    assert triton_fp8.column_maxima_row_tiles(M, cols, 1, block_cols, block_cols_t or block_cols) > 1
    x = torch.randn(M, cols, device="cuda", dtype=dtype) * torch.rand(M, 1, device="cuda", dtype=dtype)
    got = triton_fp8.fp8_quantize(x, e4m3, 1, block_cols, False, both_layouts=True, block_cols_t=block_cols_t)
    want = reference_fp8.fp8_quantize(x, e4m3, 1, block_cols, False, both_layouts=True, block_cols_t=block_cols_t)
    assert_same_outputs(got, want)


@pytest.mark.parametrize("gathered, multiplied", [(False, False), (True, False), (True, True)])
def test_the_experts_wgrad_operands_at_real_sizes_equal_the_reference(gathered, multiplied):
    """x^T per expert as the FP8 wgrad takes it (``fp8_quantize_grouped``) at Mixtral's width, groups of 1 to 9000
    rows, an empty one and rows past the last, on every SM: bit for bit the reference's. ``gathered``: the rows read
    through moe_permute's positions; ``multiplied``: times the other operand's row scales. And that operand's rowwise
    FP8 bytes moved into the same layout (``fp8_transpose_grouped``), a strided view of them, bit for bit."""
    from turbo_inductor.kernels.reference import fp8_quant_grouped as reference_grouped
    from turbo_inductor.kernels.reference import fp8_transpose as reference_transpose
    from turbo_inductor.kernels.triton import fp8_quant_grouped as triton_grouped
    from turbo_inductor.kernels.triton import fp8_transpose as triton_transpose

    e4m3 = fp8_formats(torch.device("cuda"))[0]
    offs = torch.tensor([1, 3000, 3000, 12000, 14000, 16380], dtype=torch.int32, device="cuda")
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16) * torch.rand(16384, 1, device="cuda") * 8
    rows = torch.randint(0, 16384, (16384,), device="cuda") if gathered else None
    multiplier = torch.exp2(torch.empty(16384, device="cuda").uniform_(-12, 12)) if multiplied else None
    got = triton_grouped.fp8_quantize_grouped(x, offs, e4m3, rows=rows, row_multiplier=multiplier)
    want = reference_grouped.fp8_quantize_grouped(x, offs, e4m3, rows=rows, row_multiplier=multiplier)
    assert_same_outputs(got, want)
    q = torch.randn(16384, 14400, device="cuda").to(e4m3)[:, 7:14343]
    assert_same_outputs(
        triton_transpose.fp8_transpose_grouped(q, offs), reference_transpose.fp8_transpose_grouped(q, offs)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_experts_dgrad_operands_at_real_sizes_equal_the_reference(dtype):
    """The MoE dgrad's operands as training builds them on this GPU: W's forward copy transposed (``fp8_transpose``,
    a padded view as ``weight_operands`` gives it) and dy's rows times their expert's multiplier, quantized
    (``fp8_quantize_grouped_rows``: rows in registers at 14336 columns, walked twice at 65536), bit for bit the
    reference's; and the rowwise FP8 experts' dx at the 25 dB gate against float64."""
    from turbo_inductor.kernels.reference import fp8_quant_grouped as reference_grouped
    from turbo_inductor.kernels.reference import fp8_transpose as reference_transpose
    from turbo_inductor.kernels.triton import fp8_quant_grouped as triton_grouped
    from turbo_inductor.kernels.triton import fp8_transpose as triton_transpose

    e4m3 = fp8_formats(torch.device("cuda"))[0]
    q = torch.randn(4, 4100, 4096, device="cuda").to(e4m3)[:, 3:4099]
    assert torch.equal(
        triton_transpose.fp8_transpose(q).view(torch.uint8), reference_transpose.fp8_transpose(q).view(torch.uint8)
    )
    offs = torch.tensor([1000, 1000, 3001, 4096], dtype=torch.int32, device="cuda")
    for cols in (14336, 65536):
        dy = torch.randn(4100, cols, device="cuda", dtype=dtype)
        m = torch.rand(4, cols, device="cuda").to(torch.bfloat16)
        got = triton_grouped.fp8_quantize_grouped_rows(dy, offs, m, e4m3)
        want = reference_grouped.fp8_quantize_grouped_rows(dy, offs, m, e4m3)
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    parameter = (torch.randn(4, 2048, 1024, device="cuda") * torch.rand(4, 2048, 1, device="cuda") / 32).bfloat16()
    dy = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    turbo_inductor.ops.fp8_grouped_mm(x, parameter.transpose(-2, -1), offs, "rowwise").backward(dy)
    want = torch.cat(
        [dy[a:b].double() @ parameter[g].double() for g, (a, b) in enumerate(zip([0, 1000, 1000, 3001], offs.tolist()))]
    )
    assert snr_db(x.grad, want) >= 25
