"""The grouped transposed FP8 quantization (``fp8_quantize_grouped``, the FP8 weight gradient's operands) called
directly: the reference against float64 math written here, the Triton kernel against the reference. Groups of 1 and
17 rows, empty ones first, inside and last, rows past the last group, offsets out of order or past S. Without a GPU
the Triton kernel runs in the interpreter, whose fp32 -> fp8 stores put ~2% of the values that round up onto a power
of two at half of it, round ties away from zero and truncate subnormals: there, exactly these deviations are allowed;
on a GPU the kernel equals the reference bit for bit."""

from __future__ import annotations

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference.fp8_quant_grouped import PAD_ALIGN, padded_columns
from turbo_inductor.kernels.triton import fp8_quant_grouped as triton_grouped
from turbo_inductor.kernels.triton import interpreting
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.grouped_mm import padded_layout

# The interpreter's range() over runtime bounds reads a 1-element array as a scalar: numpy warns, harmlessly.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

KERNEL = "fp8_quantize_grouped"
E4M3 = torch.float8_e4m3fn
# Mantissa bits of the OCP formats.
MANTISSA_BITS = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
# name: (end row of each group, rows of t)
PATTERNS = {
    "groups of 1 and 17, an empty one, rows past the last group": ([1, 18, 18, 23], 26),
    "empty first and last, a whole multiple of 16": ([0, 16, 30, 30], 30),
    "offsets out of order and past S": ([10, 0, 40, 7, 100], 50),
    "no rows": ([0, 0], 0),
}


# (t's dtype, the FP8 format, power-of-two scales) of the reference tests
FORMATS = pytest.mark.parametrize(
    "dtype, fp8_dtype, power_of_two",
    [
        (torch.bfloat16, torch.float8_e4m3fn, False),
        (torch.float32, torch.float8_e5m2, False),
        (torch.float16, torch.float8_e4m3fn, True),
    ],
)


def quantize(impl: str, t: torch.Tensor, offs: torch.Tensor, fp8_dtype=torch.float8_e4m3fn, **kwargs):
    return registry.implementations(KERNEL)[impl].fn(t, offs, fp8_dtype, **kwargs)


def case(pattern: str, cols: int, dtype=torch.bfloat16, seed: int = 0):
    """(t [S, cols] with column magnitudes spread over 2^-6 .. 2^6, offs)."""
    ends, rows = PATTERNS[pattern]
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, cols, generator=gen) * torch.exp2(torch.randint(-6, 7, (1, cols), generator=gen).float())
    return t.to(DEVICE, dtype), torch.tensor(ends, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("pattern", list(PATTERNS))
@FORMATS
def test_reference_against_float64(pattern, dtype, fp8_dtype, power_of_two):
    """Per group and column: the scale from the group's rows alone, the dequantized rows within the format's rounding,
    starting at the group's padded start; zeros everywhere else; the padded offsets; the rowwise copy is
    ``fp8_quantize``'s, per row over all columns."""
    t, offs = case(pattern, 24, dtype)
    q, scale, q_t, scale_t, padded_offs = quantize(
        "reference", t, offs, fp8_dtype, power_of_two=power_of_two, rowwise=True
    )
    (rows, cols), groups = t.shape, offs.shape[0]
    s_pad = padded_columns(rows, groups)
    assert q_t.shape == (cols, s_pad) and q_t.dtype == fp8_dtype and q_t.is_contiguous()
    assert scale_t.shape == (groups, cols) and scale_t.dtype == torch.float32 and scale_t.is_contiguous()
    assert padded_offs.dtype == torch.int32 and padded_offs.shape == (groups,)
    want_q, want_scale = registry.implementations("fp8_quantize")["reference"].fn(
        t, fp8_dtype, 1, max(cols, 1), False, power_of_two=power_of_two
    )
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale, want_scale)

    groups_layout = padded_layout(offs.tolist(), rows)
    padded_ends = padded_offs.tolist()
    assert padded_ends == [p + max(-(-n // PAD_ALIGN), 1) * PAD_ALIGN for _, n, p in groups_layout]
    assert padded_ends[-1] <= s_pad
    t64, q64 = t.double().cpu(), q_t.float().double().cpu()
    fmax, m = torch.finfo(fp8_dtype).max, MANTISSA_BITS[fp8_dtype]
    held = torch.zeros(s_pad, dtype=torch.bool)
    for g, (start, n, padded_start) in enumerate(groups_layout):
        rows_g = t64[start : start + n]
        ratio = rows_g.abs().amax(0).clamp_min(1e-12) if n else torch.full((cols,), 1e-12, dtype=torch.float64)
        s = scale_t[g].double().cpu()
        if power_of_two:
            assert bool((torch.frexp(s)[0] == 0.5).all()) and bool((s >= ratio / fmax * (1 - 2.0**-23)).all())
            assert bool((s < 2 * ratio / fmax).all())
        else:
            torch.testing.assert_close(s, ratio / fmax, rtol=1e-6, atol=0)
        deq = q64[:, padded_start : padded_start + n].t() * s
        # Correct rounding: within half an ulp in the normal range, half the smallest subnormal below it.
        tol = 2.0 ** -(m + 1) * (1 + 1e-5) * rows_g.abs() + torch.finfo(fp8_dtype).smallest_normal * 2.0**-m * s
        assert bool(((deq - rows_g).abs() <= tol).all())
        held[padded_start : padded_start + n] = True
    assert q_t.view(torch.uint8).cpu()[:, ~held].count_nonzero() == 0  # the padding and the columns past the groups


def _assert_same_bits_or_interpreter_defect(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal FP8 bytes. In the interpreter, a value the reference rounds onto a power of two may be stored at half,
    and any value at the neighbouring code of the same sign (a tie or a subnormal rounded the other way)."""
    got_bits, want_bits = got.view(torch.uint8).cpu().int(), want.view(torch.uint8).cpu().int()
    same = got_bits == want_bits
    if interpreting():
        w, g = want.float().cpu(), got.float().cpu()
        neighbour = ((got_bits ^ want_bits) < 0x80) & ((got_bits - want_bits).abs() == 1)
        same |= ((torch.frexp(w)[0].abs() == 0.5) & (g == w / 2)) | neighbour
    assert bool(same.all()), f"{int((~same).sum())} of {same.numel()} values differ"


@pytest.mark.parametrize(
    "pattern, dtype, block",
    [
        ("groups of 1 and 17, an empty one, rows past the last group", torch.bfloat16, (16, 16)),
        ("empty first and last, a whole multiple of 16", torch.float32, None),
        ("offsets out of order and past S", torch.float16, (16, 32)),
        ("no rows", torch.bfloat16, None),
    ],
)
def test_triton_matches_the_reference(monkeypatch, pattern, dtype, block):
    """Both layouts, scales and padded offsets. Small blocks: several row steps and column blocks per group, the last
    one partial (40 columns)."""
    if block is not None:
        monkeypatch.setattr(triton_grouped, "BLOCK_ROWS", block[0])
        monkeypatch.setattr(triton_grouped, "BLOCK_COLS", block[1])
    t, offs = case(pattern, 40, dtype, seed=1)
    got = quantize("triton", t, offs, rowwise=True)
    want = quantize("reference", t, offs, rowwise=True)
    for name, g, w in zip(("q", "scale", "q_t", "scale_t", "padded_offs"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride(), name
    _assert_same_bits_or_interpreter_defect(got[0], want[0])
    _assert_same_bits_or_interpreter_defect(got[2], want[2])
    for i in (1, 3, 4):  # the scales and the padded offsets
        assert torch.equal(got[i], want[i])
    assert all(torch.equal(g, w) for g, w in zip(quantize("triton", t, offs), got[2:]))  # the transposed alone


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_gathered_rows_equal_the_rows_gathered_first(monkeypatch, impl):
    """``rows``: t's rows read where they lie, as an MoE layer's tokens in expert order (each token k times, uneven
    groups, an empty one, rows past the last group), bit for bit what quantizing ``t[rows]`` gives."""
    monkeypatch.setattr(triton_grouped, "BLOCK_ROWS", 16)
    t, offs = case("groups of 1 and 17, an empty one, rows past the last group", 40, seed=2)
    tokens = t[:9]
    rows = torch.randperm(26, generator=torch.Generator().manual_seed(3)).to(DEVICE) % 9  # 26 rows of 9 tokens
    got = quantize(impl, tokens, offs, power_of_two=True, rows=rows)
    want = quantize(impl, tokens[rows], offs, power_of_two=True)
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)) if g.dtype == E4M3 else torch.equal(g, w)
    with pytest.raises(ValueError, match="no rowwise copy of gathered or multiplied rows"):
        quantize(impl, tokens, offs, rows=rows, rowwise=True)


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("gathered", [False, True], ids=["rows", "gathered rows"])
def test_a_row_multiplier_scales_each_operand_row(monkeypatch, impl, gathered):
    """``row_multiplier``: each operand row times its entry before the maxima, spread over 2^-12 .. 2^12 as another
    operand's row scales are: the scales per group and column are those of the product in float64, and the bytes are
    the reference's of the product given in fp32."""
    monkeypatch.setattr(triton_grouped, "BLOCK_ROWS", 16)
    t, offs = case("groups of 1 and 17, an empty one, rows past the last group", 40, seed=4)
    gen = torch.Generator().manual_seed(5)
    rows = (torch.randperm(26, generator=gen) % 9).to(DEVICE) if gathered else None
    source = t[:9] if gathered else t
    operand = source[rows] if gathered else source
    multiplier = torch.exp2(torch.empty(26).uniform_(-12, 12, generator=gen)).to(DEVICE)
    q_t, scale_t, padded_offs = quantize(impl, source, offs, rows=rows, row_multiplier=multiplier)
    product = operand.double() * multiplier.double()[:, None]
    for g, (start, n, _) in enumerate(padded_layout(offs.tolist(), 26)):
        amax = (
            product[start : start + n].abs().amax(0).clamp_min(1e-12)
            if n
            else torch.full((40,), 1e-12, device=DEVICE).double()
        )
        torch.testing.assert_close(scale_t[g].double(), amax / torch.finfo(E4M3).max, rtol=1e-6, atol=0)
    want = quantize("reference", operand.float() * multiplier[:, None], offs)
    _assert_same_bits_or_interpreter_defect(q_t, want[0])
    assert torch.equal(scale_t, want[1]) and torch.equal(padded_offs, want[2])
    with pytest.raises(ValueError, match="no rowwise copy of gathered or multiplied rows"):
        quantize(impl, t, offs, row_multiplier=multiplier, rowwise=True)
    with pytest.raises(ValueError, match=r"row_multiplier \[26\] \(one per operand row\) fp32"):
        quantize(impl, source, offs, rows=rows, row_multiplier=multiplier[1:])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf / inf in the interpreter
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_a_nan_or_inf_shows_in_its_group_and_column_only(impl):
    """A NaN (inf) makes its group's scale of its column NaN (inf) and that column of the group dequantize to NaN, as
    ``fp8_quantize``'s blocks do; the other groups and columns and the padding are untouched."""
    t, offs = case("groups of 1 and 17, an empty one, rows past the last group", 8, torch.float32)
    t[5, 2], t[20, 6] = float("nan"), float("inf")  # group 1 (q_t's columns 16 to 32), group 3 (64 to 68)
    q_t, scale_t, _ = quantize(impl, t, offs)
    bad = torch.zeros_like(scale_t, dtype=torch.bool)
    bad[1, 2] = bad[3, 6] = True
    assert bool(scale_t[1, 2].isnan()) and bool(scale_t[3, 6].isinf()) and bool(scale_t[~bad].isfinite().all())
    deq = q_t.float()
    assert bool(deq[2, 16:33].isnan().all()) and bool((deq[6, 64:69] * scale_t[3, 6]).isnan().all())
    deq[2, 16:33] = deq[6, 64:69] = 0
    assert bool(deq.isfinite().all()) and q_t.view(torch.uint8)[:, 69:].count_nonzero() == 0


# Compiles the kernel to sm_90 machine code with Triton's own ptxas, specialized as a launch on contiguous bf16 t and
# 16-byte-aligned outputs is (C a multiple of 16, as the FP8 GEMMs need); prints its 16-byte loads and stores and its
# single-byte stores.
def test_the_kernel_compiles_for_hopper_with_vector_loads_and_stores():
    """The kernel as the GPU runs it (``turbo_inductor.testing.hopper``): it reads t's rows and writes q_t's columns
    16 bytes at a time, no store a single byte. The walks' loads are pipelined (``STAGES``): 16-byte asynchronous
    copies."""
    from turbo_inductor.testing import hopper

    launches = hopper.facts_in_a_process("grouped_transposed")
    (walk,) = [f for f in launches if f["kernel"] == "_grouped_transposed_kernel"]
    assert walk["vector_loads"] > 0 and walk["vector_stores"] > 0 and walk["byte_stores"] == 0, walk


def test_bad_arguments_are_named():
    t, offs = case("empty first and last, a whole multiple of 16", 8)
    for bad, message in (
        (dict(t=t[0]), "2-D fp32/bf16/fp16 t"),
        (dict(offs=offs.long()), "offs of at least one group, 1-D int32"),
        (dict(offs=offs[:0]), "offs of at least one group, 1-D int32"),
        (dict(fp8_dtype=torch.float16), "fp8_dtype must be one of"),
    ):
        args = dict(t=t, offs=offs, fp8_dtype=torch.float8_e4m3fn) | bad
        for impl in ("reference", "triton"):
            with pytest.raises(ValueError, match=f"fp8_quantize_grouped.*{message}"):
                quantize(impl, args["t"], args["offs"], args["fp8_dtype"])


# ---- fp8_quantize_grouped_rows: each row times its group's multiplier, quantized over the row -----------------------
ROWS_KERNEL = "fp8_quantize_grouped_rows"


def quantize_rows(impl: str, t, offs, multiplier, fp8_dtype=E4M3, **kwargs):
    return registry.implementations(ROWS_KERNEL)[impl].fn(t, offs, multiplier, fp8_dtype, **kwargs)


def multiplier_for(offs: torch.Tensor, cols: int, seed: int = 0) -> torch.Tensor:
    """A multiplier per group and column in (0, 1] spread over 2^-8 .. 1, bf16 as the dgrad folds W's scales."""
    gen = torch.Generator().manual_seed(seed)
    m = torch.exp2(-8 * torch.rand(offs.shape[0], cols, generator=gen))
    return m.to(DEVICE, torch.bfloat16)


@pytest.mark.parametrize("pattern", list(PATTERNS))
@FORMATS
def test_grouped_rows_reference_against_float64(pattern, dtype, fp8_dtype, power_of_two):
    """Each row of group g times multiplier[g], rows past the last group as they are: its scale from that row's amax,
    its values within the format's rounding of the product (float64)."""
    t, offs = case(pattern, 24, dtype)
    m = multiplier_for(offs, 24)
    q, scale = quantize_rows("reference", t, offs, m, fp8_dtype, power_of_two=power_of_two)
    rows = t.shape[0]
    assert q.shape == t.shape and q.dtype == fp8_dtype and scale.shape == (rows, 1) and scale.dtype == torch.float32
    factor = torch.ones(rows, 24, dtype=torch.float64)
    for g, (start, n, _) in enumerate(padded_layout(offs.tolist(), rows)):
        factor[start : start + n] = m[g].double().cpu()
    want = t.double().cpu() * factor
    fmax, bits = torch.finfo(fp8_dtype).max, MANTISSA_BITS[fp8_dtype]
    ratio = want.abs().amax(1, keepdim=True).clamp_min(1e-12) / fmax
    s = scale.double().cpu()
    if power_of_two:
        assert bool((torch.frexp(s)[0] == 0.5).all()) and bool(
            (s >= ratio * (1 - 2.0**-23)).all() and (s < 2 * ratio).all()
        )
    else:
        torch.testing.assert_close(s, ratio, rtol=1e-6, atol=0)
    tol = 2.0 ** -(bits + 1) * (1 + 1e-5) * want.abs() + torch.finfo(fp8_dtype).smallest_normal * 2.0**-bits * s
    assert bool(((q.double().cpu() * s - want).abs() <= tol).all())


@pytest.mark.parametrize(
    "pattern, dtype, one_pass",
    [
        ("groups of 1 and 17, an empty one, rows past the last group", torch.bfloat16, True),
        ("offsets out of order and past S", torch.float32, False),
        ("empty first and last, a whole multiple of 16", torch.float16, False),
        ("no rows", torch.bfloat16, True),
    ],
)
def test_grouped_rows_triton_matches_the_reference(monkeypatch, pattern, dtype, one_pass):
    """Rows in registers, or walked twice in chunks (the last one partial: 40 columns in chunks of 16)."""
    if not one_pass:
        monkeypatch.setattr(triton_grouped, "MAX_TILE_ELEMENTS", 32)
        monkeypatch.setattr(triton_grouped, "ROW_CHUNK", 16)
    t, offs = case(pattern, 40, dtype, seed=4)
    m = multiplier_for(offs, 40, seed=5)
    for power_of_two in (False, True):
        got = quantize_rows("triton", t, offs, m, power_of_two=power_of_two)
        want = quantize_rows("reference", t, offs, m, power_of_two=power_of_two)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        _assert_same_bits_or_interpreter_defect(got[0], want[0])
        assert torch.equal(got[1], want[1])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf / inf in the interpreter
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_grouped_rows_nan_shows_in_its_row_only(impl):
    """A NaN in dy, or in a group's multiplier (a NaN in W's scales), makes the scale of each row it reaches NaN; the
    other rows keep finite scales."""
    t, offs = case("groups of 1 and 17, an empty one, rows past the last group", 8, torch.float32)
    m = multiplier_for(offs, 8).float()
    t[5, 2], m[3, 1] = float("nan"), float("nan")  # row 5 (group 1); group 3's rows 18 to 23
    scale = quantize_rows(impl, t, offs, m)[1][:, 0]
    bad = torch.zeros_like(scale, dtype=torch.bool)
    bad[5], bad[18:23] = True, True
    assert bool(scale[bad].isnan().all()) and bool(scale[~bad].isfinite().all())


def test_grouped_rows_bad_arguments_are_named():
    t, offs = case("empty first and last, a whole multiple of 16", 8)
    m = multiplier_for(offs, 8)
    for bad, message in (
        (dict(t=t[0]), "2-D fp32/bf16/fp16 t"),
        (dict(offs=offs.long()), "offs of at least one group, 1-D int32"),
        (dict(multiplier=m[:, :4]), r"a multiplier per group and column, \[4, 8\]"),
        (dict(multiplier=m.to(torch.int32)), "a multiplier per group and column"),
        (dict(fp8_dtype=torch.float16), "fp8_dtype must be one of"),
    ):
        args = dict(t=t, offs=offs, multiplier=m, fp8_dtype=E4M3) | bad
        for impl in ("reference", "triton"):
            with pytest.raises(ValueError, match=f"fp8_quantize_grouped_rows.*{message}"):
                quantize_rows(impl, args["t"], args["offs"], args["multiplier"], args["fp8_dtype"])
