"""The embedding pass: ``F.embedding`` rewritten (counts, the kernel running, results equal to
backend="inductor", ``padding_idx`` kept, near misses left alone)."""

import pytest
import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import (
    assert_left_alone,
    assert_matches_inductor,
    assert_ran,
    rewrites_without_compiling,
)


class Embedder(nn.Module):
    """A token embedding and what a decoder does next with it, as transformers writes it."""

    def __init__(self, style="hf", dtype=torch.bfloat16):
        super().__init__()
        padding = 0 if style == "padding" else None
        self.embed = nn.Embedding(300, 32, padding_idx=padding, dtype=dtype, scale_grad_by_freq=style == "by_freq")
        self.proj = nn.Linear(32, 32, bias=False, dtype=dtype)

    def forward(self, ids):
        return self.proj(self.embed(ids).relu())


def ids():
    tokens = torch.randint(0, 300, (2, 16), device=DEVICE)
    tokens[:, :3] = 0
    return tokens


@pytest.mark.parametrize("style", ["hf", "padding"])
def test_lookup_is_rewritten_and_its_gradient_matches_inductor(style):
    model = Embedder(style).to(DEVICE)
    counts = assert_matches_inductor(model, [ids()])
    assert counts["embedding"] == 1
    assert_ran("embedding_bwd", 1)


def test_the_rewrite_keeps_padding_idx():
    model = Embedder("padding").to(DEVICE)
    assert rewrites_without_compiling(model, [ids()])["embedding"] == 1
    record = turbo_inductor.compile_records()[-1]
    assert record.ops_after["turbo_inductor.embedding"] == 1


def test_near_miss_is_left_alone():
    assert_left_alone(Embedder("by_freq").to(DEVICE), [ids()])
