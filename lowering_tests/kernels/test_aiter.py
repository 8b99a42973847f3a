"""The aiter implementations (turbo_inductor/kernels/aiter/). On the CPU: the registry's choices with the real
reasons aiter is unavailable; the FP8 format conversions against torch's casts; and the adapters run end to end on a
stand-in for aiter whose functions take exactly the installed aiter's parameters. On a ROCm GPU with aiter: the
kernels against the reference semantics and in a compiled model. Their calls against aiter's source:
test_aiter_source.py."""

from __future__ import annotations

import ast
import inspect
import sys
import types

import pytest
import torch

import turbo_inductor
from turbo_inductor.kernels import aiter as adapters
from turbo_inductor.kernels import native, registry
from turbo_inductor.kernels.aiter import fp8_formats
from turbo_inductor.kernels.reference import fp8_gemm as reference_gemm
from turbo_inductor.kernels.reference import fp8_quant as reference_quant
from turbo_inductor.kernels.reference import rmsnorm as reference_rmsnorm
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.aiter import aiter_functions, aiter_root
from turbo_inductor.testing.compare import assert_matches_inductor
from turbo_inductor.testing.implementations import TakingSome
from turbo_inductor.testing.tolerance import snr_db

KERNELS = ("rmsnorm_fwd", "fp8_quantize", "fp8_gemm")  # those aiter implements
ON_AITER = adapters.unavailable_reason(torch.device(DEVICE)) is None  # imports aiter on a ROCm GPU only
on_rocm_with_aiter = pytest.mark.skipif(not ON_AITER, reason="needs aiter on a ROCm GPU")


# ---------------------------------------------------------------------------------------------------------------
# Availability and the registry's choices
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_choices():
    """The registry's and aiter's cached answers forgotten before and after (a test changes what they see)."""
    caches = (adapters.load_error, registry._candidates, fp8_formats._e4m3_of_arch)  # before any monkeypatch
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


@pytest.fixture
def rocm(monkeypatch, fresh_choices):
    """This process as a ROCm build of torch with a GPU (gfx942), for the choices made from it; no kernel runs."""
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fp8_formats, "gcn_arch", lambda device: "gfx942:sramecc+:xnack-")


CUDA = torch.device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reasons of a machine without a GPU")
def test_off_rocm_aiter_is_unavailable_and_forcing_it_names_why(fresh_choices):
    assert adapters.unavailable_reason(torch.device("cpu")) == "aiter runs on AMD GPUs (ROCm), not on cpu"
    reason = adapters.unavailable_reason(CUDA)
    assert reason.startswith("aiter needs a ROCm build of torch; torch ") and reason.endswith("built for CPU only")
    for kernel in KERNELS:
        assert "aiter" not in registry.candidates(kernel, torch.device("cpu"), "autotune")
        with pytest.raises(RuntimeError, match=f"'aiter' of {kernel} cannot run on cpu: aiter runs on AMD GPUs"):
            registry.select(kernel, torch.device("cpu"), "aiter")
    with pytest.raises(RuntimeError, match="'aiter' of fp8_gemm cannot run on cpu"):  # through the op
        torch.ops.turbo_inductor.fp8_gemm(*_gemm_operands("rowwise", torch.float8_e4m3fn), torch.bfloat16, "aiter")


def test_on_rocm_without_aiter_installed_the_reason_says_so(rocm, monkeypatch):
    monkeypatch.setitem(sys.modules, "aiter", None)  # find_spec then finds no aiter
    with pytest.raises(RuntimeError, match=r"'aiter' of rmsnorm_fwd cannot run on cuda: amd-aiter is not installed"):
        registry.select("rmsnorm_fwd", CUDA, "aiter")
    assert "aiter" not in registry.candidates("fp8_gemm", CUDA, "autotune")


def test_on_rocm_a_failing_aiter_import_is_reported_with_its_error(rocm, monkeypatch, tmp_path):
    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "__init__.py").write_text("raise RuntimeError('ROCm version file not found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    with pytest.raises(
        RuntimeError, match="cannot run on cuda: import aiter failed: RuntimeError: ROCm version file not found"
    ):
        registry.select("fp8_quantize", CUDA, "aiter")
    with pytest.raises(RuntimeError, match="turbo_inductor: import aiter failed"):
        adapters.module()


def test_on_rocm_with_aiter_auto_and_autotune_consider_it_by_priority(rocm, monkeypatch):
    monkeypatch.setattr(adapters, "load_error", lambda: None)
    # The GEMM first (tuned CK kernels); the norm and the quantization after Triton (see the modules' priorities).
    assert registry.candidates("fp8_gemm", CUDA) == ["aiter", "vendor", "triton", "reference"]
    assert registry.candidates("rmsnorm_fwd", CUDA) == ["triton"]
    native_first = ["native"] if native.unavailable_reason(CUDA) is None else []  # where the extension is built
    assert registry.candidates("fp8_quantize", CUDA) == native_first + ["triton"]
    for kernel in KERNELS:
        assert "aiter" in registry.candidates(kernel, CUDA, "autotune")
        assert not registry.traceable(kernel, CUDA, f"{kernel}=aiter")  # one call in a compiled graph
    assert "aiter" in registry.known_names("fp8_gemm")


def test_forced_aiter_names_the_arguments_it_declines(rocm, monkeypatch):
    monkeypatch.setattr(adapters, "load_error", lambda: None)
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="'aiter' of rmsnorm_fwd cannot take these arguments: bfloat16 or float16"):
        registry.select("rmsnorm_fwd", CUDA, "aiter")(x, torch.ones(64), None, 1e-6)
    with pytest.raises(ValueError, match="cannot take these arguments: a weight of x's dtype"):
        registry.select("rmsnorm_fwd", CUDA, "aiter")(x.bfloat16(), torch.ones(64), None, 1e-6)
    quantize = registry.select("fp8_quantize", CUDA, "aiter")
    with pytest.raises(ValueError, match="aiter quantizes into torch.float8_e4m3fnuz on this GPU, not .*e4m3fn"):
        quantize(x.bfloat16(), torch.float8_e4m3fn, 1, 64, False)
    with pytest.raises(ValueError, match="blocks of the whole tensor, of rows or 1 x 128 only, got 1 x 32"):
        quantize(x.bfloat16(), torch.float8_e4m3fnuz, 1, 32, False)
    with pytest.raises(ValueError, match="x's own layout only"):
        quantize(x.bfloat16(), torch.float8_e4m3fnuz, 1, 64, True)
    gemm = registry.select("fp8_gemm", CUDA, "aiter")
    a, a_scale, b, b_scale = _gemm_operands("rowwise", torch.float8_e5m2)
    with pytest.raises(ValueError, match="e4m3 operands only"):
        gemm(a, a_scale, b, b_scale, torch.bfloat16)
    a, a_scale, b, b_scale = _gemm_operands("rowwise", torch.float8_e4m3fnuz)
    with pytest.raises(ValueError, match="a bfloat16 or float16 output only, got torch.float32"):
        gemm(a, a_scale, b, b_scale, torch.float32)
    with pytest.raises(ValueError, match="scales per row .* or 1x128 x 128x128"):
        gemm(a, a_scale.expand(32, 2).contiguous(), b, b_scale, torch.bfloat16)  # 1x128 blocks of a, b per row


def test_info_reports_versions_the_device_and_each_kernels_choices():
    from turbo_inductor import info

    facts = info.report()
    device = torch.device(DEVICE)
    assert facts["turbo_inductor"] == turbo_inductor.__version__ and facts["torch"] == torch.__version__
    assert set(facts["kernels"]) == set(registry.kernels())
    for kernel, choice in facts["kernels"].items():
        assert [name.rstrip("*") for name in choice["auto"]] == registry.candidates(kernel, device)
        assert sorted(choice["available"] + list(choice["unavailable"])) == sorted(registry.implementations(kernel))
    assert ("aiter*" in facts["kernels"]["fp8_gemm"]["auto"]) == (facts["aiter"] == "available")
    text = info.format_report(facts)
    assert f"amd-aiter {facts['amd-aiter']}" in text and f"aiter: {facts['aiter']}" in text
    if DEVICE == "cpu":
        assert facts["device"].startswith("cpu") and facts["aiter"] == "aiter runs on AMD GPUs (ROCm), not on cpu"
        assert facts["kernels"]["rmsnorm_fwd"]["unavailable"]["aiter"] == facts["aiter"]
        assert "\n  rmsnorm_fwd: auto triton; available reference, triton\n" in text  # conftest: TRITON_INTERPRET=1
        assert "\n  aiter (fp8_gemm, fp8_quantize, rmsnorm_fwd): aiter runs on AMD GPUs (ROCm), not on cpu" in text


# ---------------------------------------------------------------------------------------------------------------
# FP8 format conversions against torch's own casts (every code of each format)
# ---------------------------------------------------------------------------------------------------------------
CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def test_e4m3fn_to_fnuz_keeps_every_value_exactly():
    q = CODES.view(torch.float8_e4m3fn)
    scale = torch.tensor([[0.75]])
    converted, new_scale = fp8_formats.to_format(q, scale, torch.float8_e4m3fnuz)
    assert converted.dtype == torch.float8_e4m3fnuz and new_scale.item() == 1.5
    values, finite = q.float(), torch.isfinite(q.float())
    assert torch.equal(converted.float()[finite] * new_scale, values[finite] * scale)  # 448 included: no saturation
    # Bit for bit torch's cast of the halved value (exact in fnuz), -0 (0x80, fnuz's NaN) as +0 included.
    assert torch.equal(converted.view(torch.uint8), (values / 2).to(torch.float8_e4m3fnuz).view(torch.uint8))
    assert converted.view(torch.uint8)[0x80].item() == 0 and values[0x80].item() == 0.0
    assert converted.float()[~finite].isnan().all() and int((~finite).sum()) == 2  # 0x7F and 0xFF
    assert converted.view(torch.uint8)[0x7E].item() == 0x7E and converted.float()[0x7E].item() * 2 == 448.0


def test_e4m3fnuz_to_fn_is_torchs_cast_by_value():
    q = CODES.view(torch.float8_e4m3fnuz)
    converted, scale = fp8_formats.to_format(q, torch.tensor([[3.0]]), torch.float8_e4m3fn)
    assert converted.dtype == torch.float8_e4m3fn and scale.item() == 3.0
    assert torch.equal(converted.view(torch.uint8), q.float().to(torch.float8_e4m3fn).view(torch.uint8))
    values = q.float()
    assert values[0x80].isnan() and converted.float()[0x80].isnan()  # fnuz's NaN
    assert converted.float()[0x7F].item() == 240.0 and converted.float()[0xFF].item() == -240.0  # its max: exact
    changed = torch.isfinite(values) & (converted.float() != values)
    # Only the odd multiples of 2^-10 below 2^-6, rounded to e4m3fn's step there (2^-9), to nearest even.
    assert torch.equal(changed, torch.isfinite(values) & (values.abs() < 2**-6) & ((values * 2**10) % 2 == 1))
    assert int(changed.sum()) == 16
    assert bool(((converted.float() - values).abs()[changed] == 2**-10).all())


def test_conversions_refuse_what_they_cannot_do_exactly():
    assert fp8_formats.to_format(torch.zeros(2, dtype=torch.float8_e4m3fn), torch.ones(1), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="no exact conversion of torch.float8_e5m2 into torch.float8_e4m3fnuz"):
        fp8_formats.to_format(torch.zeros(2, dtype=torch.float8_e5m2), torch.ones(1), torch.float8_e4m3fnuz)


@pytest.mark.parametrize("arch,e4m3", [("gfx942:sramecc+:xnack-", "fnuz"), ("gfx950", "fn"), ("gfx90a", "fn")])
def test_aiters_format_per_gpu(arch, e4m3, monkeypatch, fresh_choices):
    monkeypatch.setattr(fp8_formats, "gcn_arch", lambda device: arch)
    assert fp8_formats.aiter_e4m3(CUDA) == getattr(torch, f"float8_e4m3{e4m3}")


# ---------------------------------------------------------------------------------------------------------------
# The adapters end to end on a stand-in for aiter: each function takes exactly the installed aiter's parameters
# (an inspect.Signature built from its source) and computes what aiter's kernel computes, in torch.
# ---------------------------------------------------------------------------------------------------------------
def _signature(definition: ast.FunctionDef) -> inspect.Signature:
    args = definition.args
    names = [a.arg for a in args.posonlyargs + args.args]
    first_default = len(names) - len(args.defaults)
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [
        inspect.Parameter(n, kind, default=None if i >= first_default else inspect.Parameter.empty)
        for i, n in enumerate(names)
    ]
    parameters += [inspect.Parameter(a.arg, inspect.Parameter.KEYWORD_ONLY, default=None) for a in args.kwonlyargs]
    return inspect.Signature(parameters)


def _fmax(dtype):
    return torch.finfo(dtype).max


def _dynamic_quant(x, dtype, group, floor):
    """aiter's per-token / per-group kernel: scale = max(amax, floor) * (1 / fmax), q = x * (1 / scale)."""
    groups = x.float().view(x.shape[0], -1, group)
    amax = groups.abs().amax(-1).clamp_min(floor)
    scale = amax * (1 / torch.tensor(_fmax(dtype)))
    q = (groups * (1 / scale)[..., None]).to(dtype).view(x.shape)
    return q, scale


class StandIn(types.ModuleType):
    """aiter as the adapters see it, on the CPU, writing ``e4m3`` (aiter's format on the GPU simulated)."""

    def __init__(self, root, e4m3):
        super().__init__("aiter")
        self.signatures = {name: _signature(d) for name, d in aiter_functions(root).items()}
        self.e4m3, self.called = e4m3, []

    def _bind(self, name, args, kwargs):
        self.called.append(name)
        bound = self.signatures[name].bind(*args, **kwargs)  # TypeError where aiter's parameters differ
        return bound.arguments

    def rmsnorm2d_fwd(self, *args, **kwargs):
        a = self._bind("rmsnorm2d_fwd", args, kwargs)
        x = a["input"].float()
        return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + a["epsilon"]) * a["weight"].float()).to(
            a["input"].dtype
        )

    def rmsnorm2d_fwd_with_add(self, *args, **kwargs):
        a = self._bind("rmsnorm2d_fwd_with_add", args, kwargs)
        total = a["input"].float() + a["residual_in"].float()  # normalized unrounded, as ck_tile does
        a["residual_out"].copy_(total)
        a["out"].copy_(total * torch.rsqrt(total.square().mean(-1, keepdim=True) + a["epsilon"]) * a["weight"].float())

    def per_tensor_quant_hip(self, *args, **kwargs):
        a = self._bind("per_tensor_quant_hip", args, kwargs)
        assert a["quant_dtype"] == self.e4m3 and a["scale"].shape == (1,)
        return (a["x"].float() * (1 / a["scale"])).to(self.e4m3), a["scale"]

    def per_token_quant_hip(self, *args, **kwargs):
        a = self._bind("per_token_quant_hip", args, kwargs)
        assert a["quant_dtype"] == self.e4m3 and a.get("scale") is None
        return _dynamic_quant(a["x"], self.e4m3, a["x"].shape[1], 0.0)  # no floor: an all-zero row gives NaN

    def per_group_quant_hip(self, *args, **kwargs):
        a = self._bind("per_group_quant_hip", args, kwargs)
        assert a["quant_dtype"] == self.e4m3 and not a.get("transpose_scale")
        return _dynamic_quant(a["x"], self.e4m3, a["group_size"], 1e-10)

    def _check_operands(self, a):
        assert a["XQ"].dtype == a["WQ"].dtype == self.e4m3, "operands in aiter's format"
        assert a["XQ"].is_contiguous() and a["WQ"].is_contiguous() and a["dtype"] in (torch.bfloat16, torch.float16)

    def gemm_a8w8(self, *args, **kwargs):
        a = self._bind("gemm_a8w8", args, kwargs)
        self._check_operands(a)
        m, n = a["XQ"].shape[0], a["WQ"].shape[0]
        assert a["x_scale"].shape == (m, 1) and a["w_scale"].shape == (n, 1) and a.get("bias") is None
        return ((a["XQ"].float() * a["x_scale"]) @ (a["WQ"].float() * a["w_scale"]).t()).to(a["dtype"])

    def gemm_a8w8_blockscale(self, *args, **kwargs):
        a = self._bind("gemm_a8w8_blockscale", args, kwargs)
        self._check_operands(a)
        # as aiter's op_tests/test_gemm_a8w8_blockscale.py (run_torch) reads the scales
        x = a["XQ"].float() * a["x_scale"].repeat_interleave(128, 1)
        w = a["WQ"].float() * a["w_scale"].repeat_interleave(128, 0).repeat_interleave(128, 1)[: a["WQ"].shape[0]]
        return (x @ w.t()).to(a["dtype"])


@pytest.fixture(params=["gfx942", "gfx950"])
def stand_in(request, rocm, monkeypatch):
    arch = request.param
    monkeypatch.setattr(fp8_formats, "gcn_arch", lambda device: arch)
    fake = StandIn(aiter_root(), fp8_formats.aiter_e4m3(CUDA))
    monkeypatch.setitem(sys.modules, "aiter", fake)
    monkeypatch.setattr(adapters, "load_error", lambda: None)
    return fake


def _impl(kernel):
    return registry.implementations(kernel)["aiter"]


@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_maps_onto_aiter(stand_in, residual):
    x, r = torch.randn(5, 64).bfloat16(), torch.randn(5, 64).bfloat16()
    w = (torch.rand(64) + 0.5).bfloat16()
    y, s_out, rstd = registry.select("rmsnorm_fwd", CUDA, "aiter")(x, w, r if residual else None, 1e-6)
    want_y, want_s, want_rstd = reference_rmsnorm.rmsnorm_fwd(x, w, r if residual else None, 1e-6)
    torch.testing.assert_close(y, want_y, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(rstd, want_rstd, rtol=1e-5, atol=0)
    assert (s_out is None) if not residual else torch.equal(s_out, want_s)
    assert stand_in.called == ["rmsnorm2d_fwd_with_add" if residual else "rmsnorm2d_fwd"]


def test_quantization_maps_onto_aiter_and_repairs_all_zero_rows(stand_in):
    e4m3, quantize = stand_in.e4m3, _impl("fp8_quantize").fn
    x = torch.randn(6, 256).bfloat16()
    x[2] = 0.0  # an all-zero row: aiter's per-token kernel gives scale 0 and NaN codes
    q, scale = quantize(x, e4m3, 6, 256, False)  # tensorwise: the reference's results, bit for bit
    want_q, want_scale = reference_quant.fp8_quantize(x, e4m3, 6, 256, False)
    assert torch.equal(scale, want_scale) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    for block_cols in (256, 128):
        q, scale = quantize(x, e4m3, 1, block_cols, False)
        want_q, want_scale = reference_quant.fp8_quantize(x, e4m3, 1, block_cols, False)
        assert q.dtype == e4m3 and scale.shape == want_scale.shape and torch.isfinite(q.float()).all()
        kept = torch.arange(6) != 2
        torch.testing.assert_close(scale[kept], want_scale[kept], rtol=2**-22, atol=0)  # amax * (1 / fmax)
        deq = reference_gemm.dequantize(q, scale)
        assert snr_db(deq, x.float()) >= 25 and torch.equal(q[2].view(torch.uint8), torch.zeros(256, dtype=torch.uint8))
        if block_cols == 256:  # repaired to the reference's floored scale (aiter's 1x128 blocks floor at 1e-10)
            assert torch.equal(scale[2], want_scale[2])
    assert stand_in.called == ["per_tensor_quant_hip", "per_token_quant_hip", "per_group_quant_hip"]


def _gemm_operands(granularity, fp8_dtype, m=32, n=256, k=256):
    """a [m, k], b [n, k] quantized with the reference in ``granularity`` (rowwise, tensorwise or blockwise)."""
    blocks = {"rowwise": ((1, k), (1, k)), "tensorwise": ((m, k), (n, k)), "blockwise": ((1, 128), (128, 128))}
    (ab, bb) = blocks[granularity]
    a, a_scale = reference_quant.fp8_quantize(torch.randn(m, k), fp8_dtype, *ab, False)
    b, b_scale = reference_quant.fp8_quantize(torch.randn(n, k), fp8_dtype, *bb, False)
    return a, a_scale, b, b_scale


@pytest.mark.parametrize("operands", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("granularity", ["rowwise", "tensorwise", "blockwise"])
def test_gemm_maps_onto_aiter_converting_formats_exactly(stand_in, granularity, operands):
    a, a_scale, b, b_scale = _gemm_operands(granularity, getattr(torch, f"float8_{operands}"))
    out = registry.select("fp8_gemm", CUDA, "aiter")(a, a_scale, b, b_scale, torch.bfloat16)
    want = reference_gemm.fp8_gemm(a, a_scale, b, b_scale, torch.float32)
    # The same fp8 values and scales reach aiter whatever the format (the conversion is exact): only the sum's
    # order and the bf16 rounding differ from the emulation.
    torch.testing.assert_close(out.float(), want, rtol=2**-8, atol=1e-3 * want.abs().max().item())
    assert stand_in.called == ["gemm_a8w8_blockscale" if granularity == "blockwise" else "gemm_a8w8"]


def test_autotune_can_choose_aiter(stand_in, monkeypatch):
    monkeypatch.setattr(
        registry, "_seconds_per_call", lambda fn, args, kwargs, device: 1e-6 if fn is _impl("fp8_gemm").fn else 1e-3
    )
    registry._WINNERS.clear()
    a, a_scale, b, b_scale = _gemm_operands("rowwise", stand_in.e4m3)
    registry.select("fp8_gemm", CUDA, "autotune")(a, a_scale, b, b_scale, torch.bfloat16)
    assert set(registry.autotuned().values()) == {"aiter"} and turbo_inductor.kernel_calls()[("fp8_gemm", "aiter")]
    registry._WINNERS.clear()


# ---------------------------------------------------------------------------------------------------------------
# On a ROCm GPU with aiter: its kernels against the reference semantics, and in a compiled model
# ---------------------------------------------------------------------------------------------------------------
@on_rocm_with_aiter
@pytest.mark.parametrize("flags", [(True, True), (True, False)], ids=["residual", "plain"])
@pytest.mark.parametrize("H", [127, 4096, 8192])
@pytest.mark.parametrize("rows", [1, 33, 4099])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rmsnorm_on_the_gpu_against_float64(dtype, rows, H, flags):
    from turbo_inductor.testing.rmsnorm import check_fwd

    check_fwd(TakingSome("aiter"), rows, H, dtype, *flags)


@on_rocm_with_aiter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M,K", [(1, 4096), (300, 4096), (8192, 14336)])
def test_quantization_on_the_gpu_against_the_reference(M, K, dtype):
    e4m3 = fp8_formats.aiter_e4m3(torch.device(DEVICE))
    x = torch.randn(M, K, device=DEVICE).to(dtype)
    x[0] = 0.0
    quantize = _impl("fp8_quantize").fn
    q, scale = quantize(x, e4m3, M, K, False)
    want_q, want_scale = reference_quant.fp8_quantize(x, e4m3, M, K, False)
    assert torch.equal(scale, want_scale) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    for block_cols in (K, 128):
        q, scale = quantize(x, e4m3, 1, block_cols, False)
        want_q, want_scale = reference_quant.fp8_quantize(x, e4m3, 1, block_cols, False)
        torch.testing.assert_close(scale[1:], want_scale[1:], rtol=2**-22, atol=0)
        assert torch.isfinite(q.float()).all() and torch.equal(q[0].view(torch.uint8), want_q[0].view(torch.uint8))
        differ = q.view(torch.uint8) != want_q.view(torch.uint8)
        assert differ.float().mean().item() < 1e-3  # rounding boundaries only
        assert snr_db(reference_gemm.dequantize(q, scale), x.float()) >= 25


@on_rocm_with_aiter
@pytest.mark.parametrize("fmt", ["native", "other"])
@pytest.mark.parametrize("granularity", ["rowwise", "tensorwise", "blockwise"])
@pytest.mark.parametrize("m,n,k", [(16, 256, 512), (4096, 4096, 4096), (300, 576, 7168)])
def test_gemm_on_the_gpu_against_the_emulation(m, n, k, granularity, fmt):
    e4m3 = fp8_formats.aiter_e4m3(torch.device(DEVICE))
    other = torch.float8_e4m3fn if e4m3 == torch.float8_e4m3fnuz else torch.float8_e4m3fnuz
    a, a_scale, b, b_scale = (
        t.to(DEVICE) for t in _gemm_operands(granularity, e4m3 if fmt == "native" else other, m, n, k)
    )
    out = _impl("fp8_gemm").fn(a, a_scale, b, b_scale, torch.bfloat16)
    want = reference_gemm.fp8_gemm(a, a_scale, b, b_scale, torch.float32)
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


@on_rocm_with_aiter
@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_compiled_model_runs_aiter(recipe):
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.RMSNorm(1024, eps=1e-6)).to(DEVICE)
    model = model.to(torch.bfloat16)
    x = torch.randn(256, 512, device=DEVICE, dtype=torch.bfloat16)
    counts = assert_matches_inductor(model, [x], options={"impl": "rmsnorm_fwd=aiter"})
    assert counts["rmsnorm"] == 1 and ("rmsnorm_fwd", "aiter") in turbo_inductor.kernel_calls()
    turbo_inductor.reset_kernel_calls()
    compiled = torch.compile(model, backend="primus_turbo", options={"fp8": recipe})
    y = compiled(x)
    assert snr_db(y.float(), model(x).float()) >= 25
    assert ("fp8_gemm", "aiter") in turbo_inductor.kernel_calls()
