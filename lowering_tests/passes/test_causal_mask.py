"""Causal masks built in the graph: attention under one becomes SDPA's ``is_causal`` (counts, the mask gone from
the graph, outputs and gradients equal to backend="inductor"), on hand-written spellings and on transformers' own
code; any other mask is left alone."""

from unittest import mock

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.passes import causal_mask
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.attention_masks import CAUSAL, MASKS
from turbo_inductor.testing.compare import assert_matches_inductor, rewrites_without_compiling, rewritten


class Attention(nn.Module):
    """Two attention layers under one mask built in forward, as a decoder builds it once for all layers."""

    def __init__(self, mask, hidden=32, heads=4, dtype=torch.float32, padded=False):
        super().__init__()
        self.mask, self.heads, self.padded = MASKS[mask], heads, padded
        self.qkv = nn.ModuleList(nn.Linear(hidden, 3 * hidden, dtype=dtype) for _ in range(2))

    def forward(self, x, padding):
        batch, length, hidden = x.shape
        mask = self.mask(length, length, batch, x.dtype, x.device)
        if self.padded:  # a padding mask: an input, so not known at compile time
            mask = mask & padding[:, None, None, :]
        for qkv in self.qkv:
            q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape_as(x)
        return x


def inputs(dtype=torch.float32):
    return [torch.randn(2, 8, 32, device=DEVICE, dtype=dtype), torch.rand(2, 8, device=DEVICE) < 0.8]


@pytest.mark.parametrize("mask", CAUSAL)
def test_a_causal_mask_becomes_is_causal_and_matches_inductor(mask):
    counts = assert_matches_inductor(Attention(mask).to(DEVICE), inputs())
    assert counts["causal_mask"] == 2
    record = turbo_inductor.compile_records()[-1]
    assert not {"torch.arange", "torch.ones", "torch.full"} & set(record.ops_after), "the mask is gone"


def test_the_rewritten_attention_is_causal_without_a_mask():
    model, x = Attention("bool, by index").to(DEVICE), inputs()
    out, record = rewritten(model, x, {"record_graphs": True})
    calls = [line for line in record.graph_after.splitlines() if "scaled_dot_product_attention(" in line]
    assert len(calls) == 2 and all("is_causal = True" in c and "attn_mask" not in c for c in calls), calls
    with torch.no_grad():
        torch.testing.assert_close(out, model(*x))


@pytest.mark.parametrize("mask", ["sliding window", "one step ahead", "random", "additive, large finite"])
def test_other_masks_are_left_alone(mask):
    assert rewrites_without_compiling(Attention(mask).to(DEVICE), inputs())["causal_mask"] == 0


def test_a_mask_that_reads_an_input_is_left_alone():
    assert rewrites_without_compiling(Attention("bool, tril", padded=True).to(DEVICE), inputs())["causal_mask"] == 0


class Checkpointed(nn.Module):
    """The mask built once, each layer under activation checkpointing: a layer's subgraph gets the mask as an input."""

    def __init__(self):
        super().__init__()
        self.attention = Attention("bool, tril")

    def layer(self, x, mask, qkv):
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, 4, -1).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
        return x + F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape_as(x)

    def forward(self, x, padding):
        mask = MASKS["bool, tril"](x.shape[1], x.shape[1], x.shape[0], x.dtype, x.device)
        for qkv in self.attention.qkv:
            x = torch.utils.checkpoint.checkpoint(self.layer, x, mask, qkv, use_reentrant=False)
        return x


def test_a_mask_that_is_a_graph_input_is_left_alone():
    """Not computed in the graph that reads it: its value is unknown there, and no pass fails on it."""
    q = torch.randn(2, 4, 8, 8, device=DEVICE)
    mask = torch.ones(8, 8, dtype=torch.bool, device=DEVICE).tril()
    sdpa = torch.nn.Module()
    sdpa.forward = lambda q, mask: F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert rewrites_without_compiling(sdpa, [q, mask])["causal_mask"] == 0


def test_a_mask_passed_into_checkpointed_layers_is_rewritten_in_each():
    """The graph that computes the mask rewrites the attention of the checkpointed layers it passes it to; each
    layer's body then takes no mask, and the mask is no longer computed."""
    counts = assert_matches_inductor(Checkpointed().to(DEVICE), inputs())
    assert counts["causal_mask"] == len(Checkpointed().attention.qkv)
    record = turbo_inductor.compile_records()[-1]
    assert record.ops_after["Tensor.tril"] == 0 < record.ops_before["Tensor.tril"]


def test_symbolic_sizes_are_left_alone():
    model = Attention("bool, by index").to(DEVICE)
    assert rewrites_without_compiling(model, inputs(), dynamic=True)["causal_mask"] == 0


def test_a_mask_over_the_size_limit_is_left_alone():
    with mock.patch.object(causal_mask, "MAX_ELEMENTS", 8 * 8 - 1):
        assert rewrites_without_compiling(Attention("bool, tril").to(DEVICE), inputs())["causal_mask"] == 0


class ShorterQuery(nn.Module):
    """Queries for the last positions only, under transformers' bottom-right causal mask: SDPA's is_causal is
    top-left aligned, so this mask is another one."""

    def forward(self, q, kv):
        q_len, kv_len = q.shape[-2], kv.shape[-2]
        q_idx = (torch.arange(q_len, device=DEVICE) + kv_len - q_len)[None, None, :, None]
        kv_idx = torch.arange(kv_len, device=DEVICE)[None, None, None, :]
        return F.scaled_dot_product_attention(q, kv, kv, attn_mask=kv_idx <= q_idx)


def test_a_bottom_right_mask_is_left_alone():
    q, kv = torch.randn(2, 4, 3, 8, device=DEVICE), torch.randn(2, 4, 6, 8, device=DEVICE)
    assert rewrites_without_compiling(ShorterQuery(), [q, kv])["causal_mask"] == 0


def test_the_option_turns_it_off():
    model = Attention("bool, tril").to(DEVICE)
    assert "causal_mask" not in rewrites_without_compiling(model, inputs(), options={"causal_mask": False})


def test_transformers_mask_under_compile_becomes_is_causal():
    """transformers builds the causal mask under torch.compile where it cannot tell that skipping it is safe
    (5.17 on torch 2.11 does): forced here, the real modeling code's mask is rewritten in every layer."""
    pytest.importorskip("transformers")
    import transformers.masking_utils as masking

    from turbo_inductor.testing import hf

    torch.manual_seed(0)
    model = hf.CausalLMLoss(hf.build("llama3-8b", 2, tiny=True)).to(DEVICE)
    input_ids = torch.randint(0, hf.TINY["vocab_size"], (2, 16), device=DEVICE)
    with mock.patch.object(masking, "_ignore_causal_mask_sdpa", lambda *args, **kwargs: False):
        counts = assert_matches_inductor(model, [input_ids])
    assert counts["causal_mask"] == 2
