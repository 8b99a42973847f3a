"""``moe_dispatch_fp8``, the FP8 permute's kernel: each token quantized once and its FP8 row and scales stored at its k
rows in expert order, against ``fp8_quantize`` of the tokens followed by the rows' gather, bit for bit (the Triton
kernel against the Triton quantization, whose stores the interpreter rounds alike). Routings with uneven groups, an
empty expert and sentinels (indices outside [0, E), last and uncounted)."""

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.triton import moe as triton_moe
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.fp8 import E4M3, assert_bitwise_equal, quantize_rows

T, K, E = 11, 3, 4


def _dispatch(impl, x, positions, block_cols, power_of_two):
    return registry.implementations("moe_dispatch_fp8")[impl].fn(x, positions, E4M3, block_cols, power_of_two)


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize(
    "hidden, block_cols, power_of_two",
    [(40, 40, False), (64, 32, True), (200, 128, False)],
    ids=["row", "1x32", "1x128"],
)
def test_each_row_is_its_tokens_quantization(impl, hidden, block_cols, power_of_two):
    indices = torch.randint(0, E - 1, (T, K))  # the last expert gets no token
    indices = torch.where(torch.rand(T, K) < 0.2, E + 2, indices).to(DEVICE)
    _, order, positions = registry.implementations("moe_route")["reference"].fn(indices, E)
    x = torch.randn(T, hidden, device=DEVICE, dtype=torch.bfloat16) * 4
    x[3, 5] = float("nan")  # stays in its token's block and scale, in each of its k rows
    q, scale = quantize_rows(impl, x, block_cols, power_of_two)
    assert_bitwise_equal(_dispatch(impl, x, positions, block_cols, power_of_two), (q[order // K], scale[order // K]))


def test_triton_declines_blocks_it_cannot_hold():
    assert triton_moe.quantizes_rows(4096, 4096) and triton_moe.quantizes_rows(7168, 128)
    assert not triton_moe.quantizes_rows(200, 100) and not triton_moe.quantizes_rows(40000, 40000)
    with pytest.raises(ValueError, match="no blocks of 1 x 100 in rows of 200"):
        _dispatch("triton", torch.randn(2, 200, device=DEVICE), torch.zeros(2, 1, dtype=torch.int64), 100, False)
