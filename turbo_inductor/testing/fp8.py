"""FP8 helpers of the tests: a row quantization by a given implementation and a bitwise comparison of FP8 results,
and the models of the passes that join FP8 linears reading one x (``fp8_concat``, ``fp8_shared_input``)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from turbo_inductor.kernels import registry
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.graph import capture, evaluate, rewrite

E4M3 = torch.float8_e4m3fn


def quantize_rows(impl, y, block_cols, power_of_two):
    """``y`` quantized to e4m3 by ``impl``'s fp8_quantize, a scale per 1 x ``block_cols`` block: (q, scale)."""
    return registry.implementations("fp8_quantize")[impl].fn(y, E4M3, 1, block_cols, False, power_of_two=power_of_two)


def assert_bitwise_equal(got, want):
    """Each of ``got`` equal to ``want``'s bit for bit (FP8 tensors compared as their bytes), None where it is."""
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        assert g.dtype == w.dtype
        if g.dtype == E4M3:
            g, w = g.view(torch.uint8), w.view(torch.uint8)
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


# ---- linears reading one x ---------------------------------------------------------------------------------------


class Block(nn.Module):
    """q/k/v (q the widest) on one RMSNorm, a SwiGLU's gate/up on another. The branches add in parallel, so each
    linear's dy is the same with or without the concatenation: only dx and what it feeds differ (in dgrad scales)."""

    def __init__(self, bias: bool = False, ffn: int = 96):
        super().__init__()
        self.norm, self.mlp_norm = nn.RMSNorm(64, eps=1e-6), nn.RMSNorm(64, eps=1e-6)
        self.q, self.k, self.v = (nn.Linear(64, n, bias=bias) for n in (64, 32, 32))
        self.o = nn.Linear(64, 64, bias=False)
        self.gate, self.up = nn.Linear(64, ffn, bias=False), nn.Linear(64, ffn, bias=False)
        self.down = nn.Linear(ffn, 64, bias=False)
        with torch.no_grad():
            for norm in (self.norm, self.mlp_norm):
                norm.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm(x)
        q = self.q(h).view(b, s, 4, 16).transpose(1, 2)
        k = self.k(h).view(b, s, 2, 16).transpose(1, 2)
        v = self.v(h).view(b, s, 2, 16).transpose(1, 2)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        g = self.mlp_norm(x)
        return x + self.o(attention.transpose(1, 2).reshape(b, s, 64)) + self.down(F.silu(self.gate(g)) * self.up(g))


def block(**kwargs):
    """(a :class:`Block` of seed 0 on DEVICE, its input)."""
    torch.manual_seed(0)
    return Block(**kwargs).to(DEVICE), torch.randn(2, 8, 64, device=DEVICE)


class Readers(nn.Module):
    """Linears of ``rows`` outputs on one norm, with a bias where ``biases`` says. ``flat``: the first output
    viewed as one dimension, which a slice of a wider output cannot be. ``written``: x written in place after the
    first linear reads it. ``derived``: the other weights scaled by the first output's mean, known after it only."""

    def __init__(self, rows, biases=None, flat=False, written=False, derived=False):
        super().__init__()
        self.norm = nn.RMSNorm(64)
        biases = biases or [False] * len(rows)
        self.linears = nn.ModuleList(nn.Linear(64, n, bias=b) for n, b in zip(rows, biases, strict=True))
        self.flat, self.written, self.derived = flat, written, derived

    def forward(self, x):
        h = self.norm(x)
        first = self.linears[0](h)
        if self.written:
            h.mul_(2)
        rest = [
            F.linear(h, linear.weight * first.mean(), linear.bias) if self.derived else linear(h)
            for linear in self.linears[1:]
        ]
        return [first.view(-1) if self.flat else first, *rest]


def rewritten_run(model, x, options: dict, train: bool, dynamic: bool):
    """(outputs, gradients), the gradients' names and the rewrite record of ``model``'s Dynamo graph after the
    passes, run eagerly (nothing compiled). ``dynamic``: x's first size symbolic."""
    gm, inputs = capture(model, x, train, dynamic)
    names = [n.target for n, t in zip(gm.graph.find_nodes(op="placeholder"), inputs) if isinstance(t, torch.Tensor)]
    record = rewrite(gm, options)
    return evaluate(gm, inputs, train)[:2], names, record
