"""FP8 operands transposed: ``fp8_transpose`` (an MoE weight's forward copy into its dgrad layout) and
``fp8_transpose_grouped`` (an MoE operand's rowwise copy into the FP8 wgrad's padded per-group layout). The Triton
kernels against the references, byte for byte, on strided inputs and tiles cut at every edge; the grouped reference
against its layout written out."""

from __future__ import annotations

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference.fp8_quant_grouped import PAD_ALIGN, padded_columns
from turbo_inductor.kernels.triton import fp8_transpose as triton_transpose
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.grouped_mm import padded_layout

KERNEL = "fp8_transpose"


def transpose(impl: str, q: torch.Tensor) -> torch.Tensor:
    return registry.implementations(KERNEL)[impl].fn(q)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("tile", [(16, 32), None])
def test_triton_matches_the_reference(monkeypatch, fp8_dtype, tile):
    """A view with padded rows per batch (as ``weight_operands`` gives the forward copy) and sizes no tile divides."""
    if tile is not None:
        monkeypatch.setattr(triton_transpose, "TILE_ROWS", tile[0])
        monkeypatch.setattr(triton_transpose, "TILE_COLS", tile[1])
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(3, 72, 90, generator=gen) * 8).to(DEVICE, fp8_dtype)[:, 3:70]
    got, want = transpose("triton", q), transpose("reference", q)
    assert got.shape == (3, 90, 67) and got.is_contiguous() and got.dtype == fp8_dtype
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(want.view(torch.uint8), q.view(torch.uint8).transpose(1, 2))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_empty_and_bad_arguments(impl):
    assert transpose(impl, torch.empty(2, 0, 5, dtype=torch.float8_e4m3fn, device=DEVICE)).shape == (2, 5, 0)
    for bad in (torch.zeros(4, 4, dtype=torch.float8_e4m3fn), torch.zeros(1, 4, 4, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match="fp8_transpose expects a 3-D FP8 tensor"):
            transpose(impl, bad.to(DEVICE))


# ---- fp8_transpose_grouped: q [S, C]'s rows, grouped by offs, as the padded columns of q_t [C, S_pad] ---------------
GROUPED_KERNEL = "fp8_transpose_grouped"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# name: (end row of each group, rows of q)
PATTERNS = {
    "groups of 1, 17 and 5, an empty one, rows past the last group": ([1, 18, 18, 23], 26),
    "empty first and last, a whole multiple of 16": ([0, 16, 30, 30], 30),
    "offsets out of order and past S": ([10, 0, 40, 7, 100], 50),
    "no rows": ([0, 0], 0),
}


def transpose_grouped(impl: str, q: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return registry.implementations(GROUPED_KERNEL)[impl].fn(q, offs)


def random_bytes(rows: int, cols: int, fp8_dtype: torch.dtype, view: str, seed: int = 0) -> torch.Tensor:
    """q [rows, cols] of random non-zero bytes (NaN codes among them), as a column slice of a wider tensor or the
    transpose of a [cols, rows] one."""
    gen = torch.Generator().manual_seed(seed)
    if view == "column slice":
        q = torch.randint(1, 256, (rows, cols + 7), generator=gen, dtype=torch.uint8)[:, 5 : 5 + cols]
    else:
        q = torch.randint(1, 256, (cols, rows), generator=gen, dtype=torch.uint8).t()
    return q.to(DEVICE).view(fp8_dtype)


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2])
def test_grouped_reference_against_the_layout_written_out(pattern, fp8_dtype):
    """Group g's rows as q_t's columns from its padded start, byte for byte; zeros in the padding and past the groups
    (rows past the last group appear nowhere); the padded ends. ``fp8_quantize_grouped`` of q's values (within 4x of
    each other, so none quantizes to 0) holds them at exactly those columns, with the same padded ends."""
    ends, rows = PATTERNS[pattern]
    gen = torch.Generator().manual_seed(1)
    signs = torch.randint(0, 2, (rows, 24), generator=gen) * 2 - 1
    q = (signs * (1 + 3 * torch.rand(rows, 24, generator=gen))).to(DEVICE, torch.bfloat16).to(fp8_dtype)
    offs = torch.tensor(ends, dtype=torch.int32, device=DEVICE)
    q_t, padded_offs = transpose_grouped("reference", q, offs)
    s_pad = padded_columns(rows, len(ends))
    assert q_t.shape == (24, s_pad) and q_t.dtype == fp8_dtype and q_t.is_contiguous()
    groups = padded_layout(ends, rows)
    assert padded_offs.dtype == torch.int32 and padded_offs.device == offs.device
    assert padded_offs.tolist() == [p + max(-(-n // PAD_ALIGN), 1) * PAD_ALIGN for _, n, p in groups]
    q_bytes, q_t_bytes = q.view(torch.uint8).cpu(), q_t.view(torch.uint8).cpu()
    held = torch.zeros(s_pad, dtype=torch.bool)
    for start, n, padded_start in groups:
        assert torch.equal(q_t_bytes[:, padded_start : padded_start + n], q_bytes[start : start + n].t())
        held[padded_start : padded_start + n] = True
    assert q_t_bytes[:, ~held].count_nonzero() == 0
    quantized, _, quantized_offs = registry.implementations("fp8_quantize_grouped")["reference"].fn(
        q.float(), offs, fp8_dtype
    )
    assert torch.equal(quantized.view(torch.uint8) != 0, q_t.view(torch.uint8) != 0)
    assert torch.equal(quantized_offs, padded_offs)


@pytest.mark.parametrize(
    "pattern, fp8_dtype, view, tile",
    [
        ("groups of 1, 17 and 5, an empty one, rows past the last group", E4M3, "column slice", (16, 16)),
        ("offsets out of order and past S", E5M2, "transpose", (32, 8)),
        ("empty first and last, a whole multiple of 16", E4M3, "transpose", None),
        ("no rows", E5M2, "column slice", None),
    ],
)
def test_grouped_triton_matches_the_reference(monkeypatch, pattern, fp8_dtype, view, tile):
    """Random bytes, strided. Small tiles: a group over several tiles and several groups in one, the last tile of
    q_t's rows partial (40 of them)."""
    if tile is not None:
        monkeypatch.setattr(triton_transpose, "TILE_PADDED", tile[0])
        monkeypatch.setattr(triton_transpose, "TILE_Q_ROWS", tile[1])
    ends, rows = PATTERNS[pattern]
    q, offs = random_bytes(rows, 40, fp8_dtype, view), torch.tensor(ends, dtype=torch.int32, device=DEVICE)
    got, want = transpose_grouped("triton", q, offs), transpose_grouped("reference", q, offs)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_grouped_without_columns_writes_the_padded_offsets(impl):
    """q [S, 0]: q_t [0, S_pad], and each group's padded end all the same."""
    for rows in (7, 0):
        q = torch.empty(rows, 0, dtype=E4M3, device=DEVICE)
        q_t, padded_offs = transpose_grouped(impl, q, torch.tensor([3, 5], dtype=torch.int32, device=DEVICE))
        assert q_t.shape == (0, padded_columns(rows, 2)) and q_t.dtype == E4M3
        assert padded_offs.tolist() == [16, 32]


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_grouped_bad_arguments_are_named(impl):
    q, offs = random_bytes(8, 4, E4M3, "column slice"), torch.tensor([4, 8], dtype=torch.int32, device=DEVICE)
    for bad_q, bad_offs, message in (
        (q[None], offs, "a 2-D FP8 q"),
        (q.view(torch.uint8), offs, "a 2-D FP8 q"),
        (q, offs.long(), "offs of at least one group, 1-D int32"),
        (q, offs[:0], "offs of at least one group, 1-D int32"),
        (q, offs[None], "offs of at least one group, 1-D int32"),
        (q, offs.to("meta"), "offs on q's device"),
    ):
        with pytest.raises(ValueError, match=f"fp8_transpose_grouped expects {message}"):
            transpose_grouped(impl, bad_q, bad_offs)
