"""The rotary pass: Hugging Face's ``apply_rotary_pos_emb`` rewritten (counts, the kernel running forward and
backward, results equal to backend="inductor", a rotation promoted by its table under autocast, near misses left
alone)."""

import functools

import pytest
import torch
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import (
    assert_left_alone,
    assert_matches_inductor,
    assert_ran,
    rewrites_without_compiling,
)
from turbo_inductor.testing.rotary import Attention, rotate_half


def hidden(dtype=torch.bfloat16):
    return torch.randn(2, 6, 48, device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("swapped", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dynamic", [None, True])  # on a GPU, the kernel traced in with symbolic sizes
def test_rotation_is_rewritten_and_matches_inductor(swapped, dtype, dynamic):
    model = Attention(dtype, swapped=swapped).to(DEVICE)
    counts = assert_matches_inductor(model, [hidden(dtype)], dynamic=dynamic)
    assert counts["rotary"] == 2
    assert_ran("rotary", 4)  # q and k, forward and backward


def test_the_rewrite_leaves_no_rotation_behind():
    assert rewrites_without_compiling(Attention().to(DEVICE), [hidden()])["rotary"] == 2
    record = turbo_inductor.compile_records()[-1]
    assert record.ops_after["turbo_inductor.rotary"] == 2
    # the table's own cat (of its two frequency halves) stays; each rotation's cat and neg are gone
    assert record.ops_before["torch.cat"] - record.ops_after["torch.cat"] == 2 and "neg" not in record.ops_after


class NearMiss(Attention):
    """Rotations like transformers' that compute something else, or that our op does not take."""

    def __init__(self, variant):
        super().__init__(table_dtype=torch.float32 if variant == "promoting table" else None)
        self.variant = variant

    def rotate(self, x, cos, sin):
        half = x.shape[-1] // 2
        if self.variant == "negated first half":  # the transposed rotation, spelled by hand
            return x * cos + torch.cat((x[..., half:], -x[..., :half]), dim=-1) * sin
        if self.variant == "halves of another tensor":
            return x * cos + rotate_half(x * 2) * sin
        if self.variant == "table per position only":  # [S, D]: broadcasts along heads and batch, not 4-D
            return x * cos[0, 0] + rotate_half(x) * sin[0, 0]
        return super().rotate(x, cos, sin)


@pytest.mark.parametrize(
    "variant", ["negated first half", "halves of another tensor", "table per position only", "promoting table"]
)
def test_near_misses_are_left_alone(variant):
    assert_left_alone(NearMiss(variant).to(DEVICE), [hidden()])


class MixedPrecision(Attention):
    """fp32 parameters and an fp32 table under bf16 autocast (the Trainer's ``bf16=True``): q and k come out of
    their projections in bf16, their rotation promotes to fp32, and attention casts it back to bf16. ``variant``:
    a use that reads the fp32 rotation uncast, or attention with autocast turned off."""

    def __init__(self, variant="sdpa"):
        super().__init__(torch.float32, table_dtype=torch.float32)
        self.variant = variant

    def attend(self, q, k):
        if self.variant == "sdpa":  # through a cat along the sequence, as a KV cache's update is
            k = torch.cat((k[:, :, :2], k[:, :, 2:]), dim=2)
            return F.scaled_dot_product_attention(q, k, k, is_causal=True)
        if self.variant == "read uncast":
            return q @ k.transpose(-1, -2) + q.sum()
        with torch.autocast(DEVICE, enabled=False):  # "autocast off": the product runs in fp32
            return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("variant", ["sdpa", "matmul"])
def test_a_rotation_promoted_by_its_table_is_rewritten_under_autocast(variant):
    """The kernel rounds the fp32 sum to bf16 once, as autocast's cast for attention would: the same values."""
    model = MixedPrecision(variant).to(DEVICE)
    if variant == "matmul":
        model.attend = functools.partial(Attention.attend, model)
    with torch.autocast(DEVICE, torch.bfloat16):
        counts = assert_matches_inductor(model, [hidden(torch.float32)], precision=torch.bfloat16)
    assert counts["rotary"] == 2
    assert_ran("rotary", 4)


@pytest.mark.parametrize("variant, rewritten", [("read uncast", 1), ("autocast off", 0)])
def test_a_promoted_rotation_some_use_reads_in_fp32_is_left_alone(variant, rewritten):
    """q's rotation read uncast by its sum stays, k's is rewritten; with autocast off neither is."""
    with torch.autocast(DEVICE, torch.bfloat16):
        counts = rewrites_without_compiling(MixedPrecision(variant).to(DEVICE), [hidden(torch.float32)])
    assert counts["rotary"] == rewritten
