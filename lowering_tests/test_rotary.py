"""Rotary embedding: the op against float64 (both directions, a table that wants a gradient), its bad input, and the
rewrite of Hugging Face's ``apply_rotary_pos_emb`` (counts, the kernel running forward and backward, results equal
to backend="inductor", near misses left alone)."""

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from compare import assert_left_alone, assert_matches_inductor, assert_ran, rewrites_without_compiling
from conftest import DEVICE, assert_close

import turbo_inductor
from turbo_inductor.ops.library import OpInputError

IMPLS = ["triton", "reference"]


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def tables(batch, positions, dim, dtype, base=10000.0, device=DEVICE):
    """cos and sin [batch, positions, dim] as transformers' rotary embedding computes them."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=device).float() / dim)
    steps = torch.arange(positions, device=device).float() + torch.arange(batch, device=device)[:, None]
    freqs = steps[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def heads_first(batch=2, heads=3, positions=5, dim=12, dtype=torch.float32):
    """x [B, H, S, D] as attention takes it: a projection's [B, S, H, D] transposed (strided)."""
    return torch.randn(batch, positions, heads, dim, device=DEVICE, dtype=dtype).transpose(1, 2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("transposed", [False, True])
def test_opcheck(impl, transposed):
    x = heads_first().requires_grad_()
    cos, sin = (t.unsqueeze(1).requires_grad_() for t in tables(2, 5, 12, torch.float32))
    torch.library.opcheck(torch.ops.turbo_inductor.rotary, (x, cos, sin, transposed, impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [12, 96, 128])  # a half that is no power of two (Phi-3's 96), Llama's 128
def test_against_float64(impl, dtype, dim):
    x = heads_first(dim=dim, dtype=dtype).requires_grad_()
    cos, sin = tables(2, 5, dim, dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    out = turbo_inductor.ops.rotary(x, cos, sin, impl=impl)
    assert out.stride() == x.stride(), "x's layout"
    dout = torch.randn_like(out)
    out.backward(dout)
    x64 = x.detach().double().requires_grad_()
    expected = x64 * cos.double() + rotate_half(x64) * sin.double()
    expected.backward(dout.double())
    assert_close(out, expected, dtype)
    assert_close(x.grad, x64.grad, dtype)


@pytest.mark.parametrize("impl", IMPLS)
def test_positions_before_heads(impl):
    """transformers' ``unsqueeze_dim=2``: x [B, S, H, D], the table [B, S, 1, D]."""
    x = torch.randn(2, 5, 3, 12, device=DEVICE)
    cos, sin = (t.unsqueeze(2) for t in tables(2, 5, 12, torch.float32))
    out = turbo_inductor.ops.rotary(x, cos, sin, impl=impl)
    assert_close(out, x.double() * cos.double() + rotate_half(x.double()) * sin.double(), torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_table_that_wants_a_gradient_gets_it(impl):
    x = heads_first().requires_grad_()
    cos, sin = (torch.randn(1, 1, 5, 12, device=DEVICE, requires_grad=True) for _ in range(2))
    out = turbo_inductor.ops.rotary(x, cos, sin, impl=impl)
    dout = torch.randn_like(out)
    out.backward(dout)
    leaves = [t.detach().double().requires_grad_() for t in (x, cos, sin)]
    (leaves[0] * leaves[1] + rotate_half(leaves[0]) * leaves[2]).backward(dout.double())
    for got, want in zip((x.grad, cos.grad, sin.grad), (leaf.grad for leaf in leaves)):
        assert_close(got, want, torch.float32)


def test_bad_input_names_the_problem():
    x = heads_first()
    cos, sin = (t.unsqueeze(1) for t in tables(2, 5, 12, torch.float32))
    cases = [
        ((x[0], cos, sin), "x must be 4-D"),
        ((x[..., :11], cos[..., :11], sin[..., :11]), "last dimension must be even"),
        ((x, cos[:, :, :4], sin[:, :, :4]), r"cos \[2, 1, 4, 12\] and sin \[2, 1, 4, 12\] must be one 4-D shape"),
        ((x, cos, sin[:1]), "must be one 4-D shape"),
        ((x, cos.long(), sin), "cos has dtype torch.int64"),
    ]
    for args, message in cases:
        with pytest.raises(OpInputError, match=message):
            torch.ops.turbo_inductor.rotary(*args)


class Attention(nn.Module):
    """q and k projected, split in heads and rotated as transformers' Llama attention does; the rotation's output
    goes on through one more product (attention would read it)."""

    def __init__(self, dtype=torch.bfloat16, hidden=48, heads=4, swapped=False, table_dtype=None):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        self.k = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        self.swapped, self.table_dtype = swapped, table_dtype or dtype

    def rotate(self, x, cos, sin):
        if self.swapped:  # the other order of every product and of the sum
            return sin * rotate_half(x) + cos * x
        return (x * cos) + (rotate_half(x) * sin)

    def forward(self, hidden):
        batch, positions, _ = hidden.shape
        cos, sin = tables(batch, positions, self.dim, self.table_dtype, device=hidden.device)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = self.q(hidden).view(batch, positions, self.heads, self.dim).transpose(1, 2)
        k = self.k(hidden).view(batch, positions, self.heads, self.dim).transpose(1, 2)
        return self.attend(self.rotate(q, cos, sin), self.rotate(k, cos, sin))

    def attend(self, q, k):
        return q @ k.transpose(-1, -2)


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
