"""The fp8_scaled_mm pass: FP8 inference written by hand (dynamic scales, then ``torch._scaled_mm``) runs on our
quantization; other hand quantizations are left alone."""

import pytest
import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_left_alone
from turbo_inductor.testing.tolerance import snr_db

E4M3_MAX = 448.0


class HandQuantized(nn.Module):
    """FP8 inference written by hand, torchao style: dynamic scales (tensorwise, per row: dim -1, or per column:
    dim 0), then torch._scaled_mm accumulating fast."""

    def __init__(self, floor=1e-12, x_dim=None, w_dim=None, fast_accum=True):
        super().__init__()
        self.floor, self.x_dim, self.w_dim, self.fast_accum = floor, x_dim, w_dim, fast_accum
        self.w = nn.Parameter(torch.randn(48, 64, dtype=torch.bfloat16) * 0.05)

    def scale(self, t, dim):
        amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
        return amax.float().clamp(min=self.floor) / E4M3_MAX

    def forward(self, x):
        sx, sw = self.scale(x, self.x_dim), self.scale(self.w, self.w_dim)
        x8 = (x.float() / sx).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        w8 = (self.w.float() / sw).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return torch._scaled_mm(
            x8,
            w8.t(),
            scale_a=sx,
            scale_b=sw if self.w_dim is None else sw.t(),
            out_dtype=torch.bfloat16,
            use_fast_accum=self.fast_accum,
        )


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's torch._scaled_mm; the GPU's is the vendor path")
@pytest.mark.parametrize("dim", [None, -1], ids=["tensorwise", "rowwise"])
def test_hand_quantized_scaled_mm_runs_on_our_quantization(dim):
    model, x = HandQuantized(x_dim=dim, w_dim=dim), torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = torch.compile(model, backend="inductor")(x)
        torch._dynamo.reset()
        got = torch.compile(model, backend="primus_turbo", options={"impl": "reference", "record_graphs": True})(x)
    assert turbo_inductor.rewrite_counts()["fp8_scaled_mm"] == 1
    record = turbo_inductor.compile_records()[-1]
    assert record.ops_before["torch._scaled_mm"] == 1 and record.ops_after["torch._scaled_mm"] == 0
    assert record.ops_after["Tensor.amax"] == 0 and record.ops_after["Tensor.clamp"] == 0
    assert record.ops_after["turbo_inductor.fp8_linear"] == 1
    assert any(
        f"'{'tensorwise' if dim is None else 'rowwise'}'" in line
        for line in record.graph_after.splitlines()
        if "fp8_linear" in line
    )
    # The same quantization math, but 1/s multiplies where the hand-written code divides by s: the two differ by one
    # fp32 ulp, which moves an fp8 value one step where it lands on a rounding boundary (a few elements in a
    # thousand): the outputs agree well beyond FP8's own error (~30 dB against bf16; 40-50 dB seen), not elementwise.
    assert snr_db(got, want) >= 35


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's torch._scaled_mm; the GPU's is the vendor path")
@pytest.mark.parametrize(
    "variant",
    [
        {"floor": 1e-6},
        {"floor": 1e-6, "x_dim": -1, "w_dim": -1},
        {"fast_accum": False},
        {"x_dim": -1, "w_dim": -1, "fast_accum": False},
    ],
    ids=["tensorwise_other_floor", "rowwise_other_floor", "tensorwise_full_accumulation", "rowwise_full_accumulation"],
)
def test_other_hand_quantization_is_left_alone(variant):
    assert_left_alone(HandQuantized(**variant), [torch.randn(32, 64, dtype=torch.bfloat16)], train=False)
