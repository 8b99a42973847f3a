"""Property-based fuzzing of the rewrites: random small models built from the patterns the backend fuses, their
near misses and unrelated ops, compiled with backend="primus_turbo" and backend="inductor", must give the same
outputs and gradients. CI runs a bounded number of examples; TURBO_FUZZ_EXAMPLES=200 runs more."""

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from compare import assert_as_accurate_as_inductor, assert_matches_inductor

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

BLOCKS = [
    "hf_norm",
    "titan_norm",
    "torch_norm",
    "residual_norm",
    "swiglu",
    "swiglu_chunk",
    "geglu_tanh",
    "sigmoid_gate",
    "norm_other_dim",
    "cube_norm",
    "linear",
    "gelu",
    "transpose_roundtrip",
    "scale",
]


class Block(nn.Module):
    def __init__(self, kind: str, hidden: int, eps: float, weight_first: bool):
        super().__init__()
        self.kind, self.eps, self.weight_first = kind, eps, weight_first
        self.weight = nn.Parameter(torch.randn(hidden) * 0.5 + 1)
        self.proj = nn.Linear(hidden, 2 * hidden, bias=False)
        self.back = nn.Linear(hidden, hidden, bias=False)

    def norm(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype) if self.weight_first else h.to(dtype) * self.weight

    def forward(self, x, residual):
        k = self.kind
        if k == "hf_norm":
            return self.norm(x), residual
        if k == "titan_norm":
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight, residual
        if k == "torch_norm":
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps), residual
        if k == "residual_norm":
            total = x + residual
            return self.norm(total), total
        if k in ("swiglu", "swiglu_chunk", "geglu_tanh", "sigmoid_gate"):
            gate, up = self.proj(x).chunk(2, -1)
            if k == "swiglu":
                gate = gate.contiguous()  # two separate tensors
                return self.back(F.silu(gate) * up), residual
            if k == "geglu_tanh":
                return self.back(up * F.gelu(gate, approximate="tanh")), residual
            if k == "sigmoid_gate":
                return self.back(torch.sigmoid(gate) * up), residual
            return self.back(F.silu(gate) * up), residual
        if k == "norm_other_dim":
            return x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + self.eps), residual
        if k == "cube_norm":
            return x * torch.rsqrt(x.abs().pow(3).mean(-1, keepdim=True) + self.eps), residual
        if k == "linear":
            return self.back(x), residual
        if k == "gelu":
            return F.gelu(x), residual
        if k == "transpose_roundtrip":
            return x.transpose(0, 1).contiguous().transpose(0, 1) * 1.5, residual
        if k == "scale":
            return x * 0.5 + residual, residual
        raise AssertionError(k)


class RandomModel(nn.Module):
    def __init__(self, specs, hidden):
        super().__init__()
        self.blocks = nn.ModuleList(Block(kind, hidden, eps, first) for kind, eps, first in specs)

    def forward(self, x):
        residual = x
        for block in self.blocks:
            x, residual = block(x, residual)
        return x, residual


specs = st.lists(
    st.tuples(st.sampled_from(BLOCKS), st.sampled_from([1e-6, 1e-5, 1e-3]), st.booleans()), min_size=1, max_size=5
)


@hypothesis.settings(
    max_examples=int(os.environ.get("TURBO_FUZZ_EXAMPLES", "6")),
    deadline=None,
    derandomize="TURBO_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=list(hypothesis.HealthCheck),
)
@hypothesis.given(
    specs=specs,
    hidden=st.sampled_from([16, 48]),
    batch=st.integers(1, 3),
    seq=st.integers(1, 5),
    train=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    impl=st.sampled_from(["auto", "reference"]),
)
def test_random_models_match_inductor(specs, hidden, batch, seq, train, dtype, impl):
    """impl "auto": our ops stay calls (the Triton interpreter); "reference": they are traced into the graph and
    compiled by Inductor, as on a GPU."""
    torch.manual_seed(0)
    model = RandomModel(specs, hidden).to(dtype)
    inputs = [torch.randn(batch, seq, hidden, dtype=dtype)]
    if dtype == torch.float32:
        assert_matches_inductor(model, inputs, train=train, options={"impl": impl})
    else:  # bf16 roundings along chains of norms drift: judge both against float64
        assert_as_accurate_as_inductor(model, inputs, train=train, options={"impl": impl})
