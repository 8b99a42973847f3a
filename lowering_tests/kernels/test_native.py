"""The native kernels (csrc/): the Python layer without the extension, the CUDA sources' HIP translation, the Meta
kernels (built on the CPU from csrc/registration.cpp), and, where the extension was built (GPU), the ops against
the Triton kernels and in a compiled model. Their numerics against float64 run in kernels/test_rmsnorm.py and
kernels/test_fp8_quant.py, which take the native implementation where it is built."""

import pathlib
import re
import shutil
import sys

import pytest
import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor.kernels import native, registry
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_matches_inductor

CSRC = pathlib.Path(__file__).resolve().parents[2] / "csrc"
BUILT = native.load_error() is None
on_gpu_with_native = pytest.mark.skipif(DEVICE != "cuda" or not BUILT, reason="needs the native extension on a GPU")


# ---------------------------------------------------------------------------------------------------------------
# Without the extension (CPU CI)
# ---------------------------------------------------------------------------------------------------------------
def test_python_layer_works_without_native_kernels():
    cpu = torch.device("cpu")
    for kernel in ("rmsnorm_fwd", "rmsnorm_bwd", "fp8_quantize"):
        assert "native" in registry.implementations(kernel)
        assert (
            registry.implementations(kernel)["native"].unavailable_reason(cpu) == "the native kernels run on GPUs only"
        )
    with pytest.raises(RuntimeError, match="'native' of rmsnorm_fwd cannot run on cpu: the native kernels run on GPUs"):
        turbo_inductor.ops.rmsnorm(torch.randn(4, 8), torch.randn(8), impl="native")
    x = torch.randn(4, 8)
    torch.testing.assert_close(
        turbo_inductor.ops.rmsnorm(x, None, eps=1e-6), x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    )


def test_the_dispatcher_sends_each_quantization_to_the_faster_kernel():
    """The native quantization declines what the H200 measured faster in Triton: row blocks in one layout on long
    rows (inference's x and W); both layouts, column blocks and short rows stay native."""
    from turbo_inductor.kernels.native import fp8_quant as native_fp8

    e4m3, long_rows = torch.float8_e4m3fn, torch.empty(4, 8192, dtype=torch.bfloat16)
    assert "Triton's kernel is faster" in native_fp8.supports(long_rows, e4m3, 1, 8192, False)
    assert native_fp8.supports(long_rows, e4m3, 1, 8192, False, both_layouts=True) is None
    assert native_fp8.supports(long_rows, e4m3, 4, 1, True) is None  # x^T's rows: x's columns
    assert native_fp8.supports(long_rows, e4m3, 4, 8192, False) is None  # tensorwise
    assert native_fp8.supports(torch.empty(4, 4096, dtype=torch.bfloat16), e4m3, 1, 4096, False) is None


def test_per_expert_column_blocks_of_x_t_are_declined_and_named_when_forced():
    """x^T's blocks of ``block_cols_t`` columns: native where they span x^T's rows, as block_cols would; an MoE
    weight's per-expert blocks go to Triton, and a direct call names them (the kernels would cut whole columns)."""
    from turbo_inductor.kernels.native import fp8_quant as native_fp8

    e4m3, weights = torch.float8_e4m3fn, torch.randn(4 * 32, 64, dtype=torch.bfloat16)
    assert native_fp8.supports(weights, e4m3, 1, 64, False, both_layouts=True, block_cols_t=4 * 32) is None
    assert "32 on x^T" in native_fp8.supports(weights, e4m3, 1, 64, False, both_layouts=True, block_cols_t=32)
    with pytest.raises(ValueError, match="native fp8_quantize cannot take these blocks: .* 1 x 32 on x\\^T"):
        native_fp8.fp8_quantize(weights, e4m3, 1, 64, False, both_layouts=True, block_cols_t=32)


@pytest.mark.skipif(BUILT, reason="the extension is built here")
def test_missing_extension_is_explained():
    assert "native extension is not built" in native.load_error() and "README" in native.load_error()


# ---------------------------------------------------------------------------------------------------------------
# HIP translation: what hipify leaves of csrc/ compiles for ROCm only if no CUDA-only spelling survives in the code
# a HIP build sees (its USE_ROCM branches).
# ---------------------------------------------------------------------------------------------------------------
CUDA_ONLY = re.compile(
    r"\b(cuda[A-Z]\w*|__nv_\w+|nv_bfloat16\w*|cub::|asm|__shfl(_\w+)?_sync|__ballot_sync|__activemask|"
    r"cuda_(fp8|fp16|bf16|runtime)\.h|__CUDA_ARCH__|CUDART_\w+|__syncwarp|__v(max|min)[su][24])\b"
)
BRANCH = re.compile(r"#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)")


def hip_view(source: str) -> str:
    """The lines a HIP build compiles: USE_ROCM conditionals resolved as defined (others kept whole)."""
    kept, stack = [], []  # stack: (is_rocm_conditional, keeping) per open #if
    for line in source.splitlines():
        match = BRANCH.match(line.strip())
        keeping = all(k for _, k in stack)
        if match:
            word, rest = match.groups()
            if word in ("if", "ifdef", "ifndef"):
                rocm = "USE_ROCM" in rest
                positive = not (word == "ifndef" or "!" in rest) if rocm else True
                stack.append((rocm, positive))
                continue
            if word == "else" and stack and stack[-1][0]:
                stack[-1] = (True, not stack[-1][1])
                continue
            if word == "endif" and stack:
                stack.pop()
                continue
        if keeping:
            kept.append(line)
    return "\n".join(kept)


def cuda_only_spellings(source: str) -> list[str]:
    code = re.sub(r"//.*", "", hip_view(source))
    return sorted({m.group(0) for m in CUDA_ONLY.finditer(code)})


def hipify(directory: pathlib.Path) -> dict[str, str]:
    """What a ROCm build compiles of ``directory``: each file's hipified version (the file itself where hipify
    changed nothing), by the source's name, as torch's extension builder runs hipify."""
    from torch.utils.hipify import hipify_python

    results = hipify_python.hipify(
        project_directory=str(directory),
        output_directory=str(directory),
        includes=[str(directory / "*")],
        is_pytorch_extension=True,
        show_progress=False,
    )
    return {
        pathlib.Path(source).name: pathlib.Path(result.hipified_path or source).read_text()
        for source, result in results.items()
    }


def test_hipify_leaves_no_cuda_only_code(tmp_path):
    shutil.copytree(CSRC, tmp_path / "csrc")
    translated = hipify(tmp_path / "csrc")
    assert set(translated) == {p.name for p in CSRC.iterdir()}
    assert "hipGetLastError" in translated["common.cuh"]  # translated indeed
    for name, text in translated.items():
        assert cuda_only_spellings(text) == [], name
    # The CUDA branch does hold CUDA-only code (the check above looked past it, not at nothing).
    assert "__nv_cvt_float2_to_fp8x2" in (CSRC / "common.cuh").read_text()


def test_the_check_finds_what_hip_cannot_compile(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "bad.cu").write_text(
        "#include <cuda_fp8.h>\n"
        '__device__ float f(float v) { asm volatile(""); return __shfl_xor_sync(0xffffffff, v, 1); }\n'
        "#ifndef USE_ROCM\n__device__ void g() { __nv_cvt_float_to_fp8(0.f, __NV_SATFINITE, __NV_E4M3); }\n#endif\n"
    )
    found = set().union(*(cuda_only_spellings(t) for t in hipify(tmp_path / "csrc").values()))
    assert {"asm", "__shfl_xor_sync"} <= found and "__nv_cvt_float_to_fp8" not in found


# ---------------------------------------------------------------------------------------------------------------
# Meta kernels (the exact fakes), built on the CPU from the schema file alone
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def native_ops():
    if not BUILT:
        pytest.importorskip("ninja")
        from torch.utils.cpp_extension import load

        # -O0: the meta kernels only compute shapes, and torch's headers build in half the time unoptimized. A
        # library, not a Python module: loading it registers the ops.
        load(
            name="turbo_inductor_native_meta",
            sources=[str(CSRC / "registration.cpp")],
            extra_cflags=["-O0"],
            is_python_module=False,
            verbose=False,
        )
    return torch.ops.turbo_inductor_native


def test_meta_kernels_give_the_reference_shapes(native_ops):
    from turbo_inductor.kernels.reference import fp8_quant, rmsnorm

    x, w = torch.randn(5, 12, dtype=torch.bfloat16), torch.randn(12, dtype=torch.bfloat16)
    meta = lambda t: t.to("meta") if t is not None else None  # noqa: E731
    for weight, residual in [(w, x), (None, None)]:
        got = native_ops.rmsnorm_fwd(meta(x), meta(weight), meta(residual), 1e-6)
        want = rmsnorm.rmsnorm_fwd(x, weight, residual, 1e-6)
        assert [(g.shape, g.dtype) for g in got[::2]] == [(t.shape, t.dtype) for t in want[::2]]
        assert got[1].shape == (x.shape if residual is not None else (0,))
        dx, dw = native_ops.rmsnorm_bwd(meta(x), meta(x), meta(weight), meta(want[2]), None)
        assert (dx.shape, dx.dtype) == (x.shape, x.dtype) and dw.shape == (w.shape if weight is not None else (0,))
    for M, K, br, bc in [(5, 12, 12, 12), (5, 12, 1, 12), (5, 12, 5, 1), (7, 3, 1, 1000)]:
        for transpose, both in [(False, False), (True, False), (False, True)]:
            got = native_ops.fp8_quantize(meta(x.new_empty(M, K)), torch.float8_e5m2, br, bc, transpose, False, both)
            want = fp8_quant.fp8_quantize(torch.randn(M, K), torch.float8_e5m2, br, bc, transpose, both_layouts=both)
            assert [(g.shape, g.dtype) for g in got[: len(want)]] == [(t.shape, t.dtype) for t in want]
            assert both or [g.shape for g in got[2:]] == [(0,), (0,)]


def test_meta_kernels_take_symbolic_sizes(native_ops):
    from torch.fx.experimental.proxy_tensor import make_fx

    shapes = []

    def f(x):
        q, scale, q_t, _ = native_ops.fp8_quantize(x, torch.float8_e4m3fn, 1, x.shape[1], False, False, True)
        y, _, rstd = native_ops.rmsnorm_fwd(x, None, None, 1e-6)
        shapes.append((q.shape, scale.shape, q_t.shape, y.shape, rstd.shape))
        return q, y

    graph = make_fx(f, tracing_mode="symbolic")(torch.randn(7, 16))
    ((q, scale, q_t, y, rstd),) = shapes
    rows = q[0]
    assert isinstance(rows, torch.SymInt) and q == (rows, 16) and q_t == (16, rows) and scale == (rows, 1)
    assert y == (rows, 16) and rstd == (rows,)
    assert "turbo_inductor_native.fp8_quantize" in graph.code


# ---------------------------------------------------------------------------------------------------------------
# GPU, where the extension was built
# ---------------------------------------------------------------------------------------------------------------
@on_gpu_with_native
def test_native_ops_pass_opcheck():
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    ops = torch.ops.turbo_inductor_native
    torch.library.opcheck(ops.rmsnorm_fwd, (x, w, x.clone(), 1e-6))
    rstd = ops.rmsnorm_fwd(x, w, None, 1e-6)[2]
    torch.library.opcheck(ops.rmsnorm_bwd, (x.clone(), x, w, rstd, None))
    for args in [(1, 512, False, False, True), (64, 512, True, False, False), (64, 1, True, True, False)]:
        torch.library.opcheck(
            ops.fp8_quantize, (x, torch.float8_e4m3fn, *args), test_utils=("test_schema", "test_faketensor")
        )
    # our public ops with the native implementation forced, autograd included
    torch.library.opcheck(torch.ops.turbo_inductor.rmsnorm_fwd, (x.requires_grad_(), w, 1e-6, "native"))


@on_gpu_with_native
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,H", [(8192, 4096), (1000, 4097), (300, 14336)])
def test_native_agrees_with_triton_at_real_sizes(rows, H, dtype):
    from turbo_inductor.kernels.triton import fp8_quant as triton_fp8
    from turbo_inductor.kernels.triton import rmsnorm as triton_rmsnorm

    if H * torch.empty((), dtype=dtype).element_size() > 32768:
        pytest.skip("wider than the native kernels' rows")
    g = torch.Generator(device="cuda").manual_seed(0)
    x, r, dy = (torch.randn(rows, H, device="cuda", generator=g).to(dtype) for _ in range(3))
    w = torch.rand(H, device="cuda", generator=g).to(dtype) + 0.5
    nat = registry.implementations("rmsnorm_fwd")["native"].fn(x, w, r, 1e-6)
    tri = triton_rmsnorm.rmsnorm_fwd(x, w, r, 1e-6)
    assert torch.equal(nat[1], tri[1])  # the rounded sum, bit for bit
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(nat[0], tri[0], rtol=tol, atol=tol)
    torch.testing.assert_close(nat[2], tri[2], rtol=1e-5, atol=1e-6)
    nat_b = registry.implementations("rmsnorm_bwd")["native"].fn(dy, nat[1], w, nat[2], r)
    again = registry.implementations("rmsnorm_bwd")["native"].fn(dy, nat[1], w, nat[2], r)
    assert torch.equal(nat_b[0], again[0]) and torch.equal(nat_b[1], again[1])  # deterministic, dw included
    tri_b = triton_rmsnorm.rmsnorm_bwd(dy, nat[1], w, nat[2], r)
    torch.testing.assert_close(nat_b[0], tri_b[0], rtol=tol, atol=tol)
    torch.testing.assert_close(nat_b[1].float(), tri_b[1].float(), rtol=tol, atol=tol * rows**0.5)
    quantize = registry.implementations("fp8_quantize")["native"].fn
    whole = max(rows, H)  # the whole dimension in either layout
    for br, bc, transpose, both in [
        (whole, whole, False, True),
        (1, whole, False, True),
        (1, H, False, False),
        (rows, 1, True, False),
    ]:
        got = quantize(x, torch.float8_e4m3fn, br, bc, transpose, both_layouts=both)
        want = triton_fp8.fp8_quantize(x, torch.float8_e4m3fn, br, bc, transpose, both_layouts=both)
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got[1::2], want[1::2]))  # scales
        for a, b in zip(got[::2], want[::2]):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@on_gpu_with_native
def test_compiled_model_runs_native_kernels_forward_and_backward():
    model = nn.Sequential(nn.Linear(256, 512), nn.RMSNorm(512, eps=1e-6)).cuda().to(torch.bfloat16)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    counts = assert_matches_inductor(model, [x], options={"impl": "native"})
    assert counts["rmsnorm"] == 1
    assert {("rmsnorm_fwd", "native"), ("rmsnorm_bwd", "native")} <= set(turbo_inductor.kernel_calls())


# ---------------------------------------------------------------------------------------------------------------
# setup.py: it says on stdout whether it built the native kernels; a failed build installs the package without
# them, unless they are required (TURBO_INDUCTOR_NATIVE=1), which fails the install wherever they are not built
# ---------------------------------------------------------------------------------------------------------------
def _setup_helpers(monkeypatch) -> dict:
    import runpy

    monkeypatch.setattr(
        sys, "argv", ["setup.py", "build_ext", "--inplace"]
    )  # a build (pip's metadata runs say nothing)
    return runpy.run_path(str(CSRC.parent / "setup.py"), run_name="turbo_inductor_setup")


@pytest.mark.parametrize(
    "source, required", [("int broken( {\n", False), ("int broken( {\n", True), ("int f();\n", False)]
)
def test_failed_native_build_installs_without_it_unless_required(tmp_path, monkeypatch, capsys, source, required):
    import setuptools
    from torch.utils import cpp_extension

    helpers = _setup_helpers(monkeypatch)
    (tmp_path / "ext.cpp").write_text(source)  # "broken": a compiler error, as a mismatched toolkit would give
    monkeypatch.chdir(tmp_path)
    build = helpers["optional_build"](cpp_extension.BuildExtension, required, "sm_90")

    def run():
        setuptools.setup(
            name="ext",
            script_args=["-q", "build_ext", "--inplace"],
            cmdclass={"build_ext": build},
            ext_modules=[cpp_extension.CppExtension("ext", ["ext.cpp"])],
        )

    if required:
        with pytest.raises(RuntimeError, match="Error compiling objects"):
            run()
    elif "broken" in source:
        run()
        assert "turbo_inductor: native kernels skipped (their build failed" in capsys.readouterr().out
        assert not list(tmp_path.glob("ext*.so"))
    else:
        run()
        assert "turbo_inductor: native kernels built for sm_90\n" in capsys.readouterr().out
        assert list(tmp_path.glob("ext*.so"))


@pytest.mark.parametrize(
    "cause, reason",
    [
        ("torch is not importable", "torch is not importable while building"),  # pip's isolation, or the system pip
        ("a CPU-only torch", r"torch \S+ is built for neither CUDA nor ROCm"),
    ],
)
def test_required_native_kernels_fail_the_install_wherever_they_are_not_built(monkeypatch, capsys, cause, reason):
    helpers = _setup_helpers(monkeypatch)
    if cause == "torch is not importable":
        monkeypatch.setitem(sys.modules, "torch", None)
    else:
        monkeypatch.setattr(torch.version, "cuda", None)
        monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("TURBO_INDUCTOR_NATIVE", "1")
    with pytest.raises(SystemExit, match=f"TURBO_INDUCTOR_NATIVE=1 requires the native kernels, but {reason}"):
        helpers["native_extension"]()
    monkeypatch.delenv("TURBO_INDUCTOR_NATIVE")  # by default: the package alone, and why, on stdout
    assert helpers["native_extension"]() == ([], {})
    assert re.search(f"^turbo_inductor: native kernels skipped \\({reason}", capsys.readouterr().out, re.M)
