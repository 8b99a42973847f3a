"""Grouped GEMMs whose implementation reads offs on the host: one ``copy_to_host`` of each offs, queued where offs
are made, read by every such GEMM forward and backward (saved, not copied again); none where every implementation
launches ahead. Outputs and gradients are Inductor's."""

import pytest
import torch

import turbo_inductor
from turbo_inductor.kernels import host_copy
from turbo_inductor.ops.grouped_mm import GroupedMMNode
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_matches_inductor, rewrites_without_compiling
from turbo_inductor.testing.grouped_mm import HOST_READING, register_host_reading
from turbo_inductor.testing.moe import TitanMoE, hf_sparse_moe

EXPERTS, HIDDEN, INTERMEDIATE, TOKENS, TOP_K = 4, 64, 32, 16, 2
KERNELS = GroupedMMNode.kernels
FORCED = {"impl": {kernel: HOST_READING for kernel in KERNELS}}


@pytest.fixture
def host_reading(monkeypatch):
    """``host_reading`` (testing/grouped_mm.py) registered: the list of (kernel, given a host copy of offs) per call,
    and of the copies made."""
    copies = []
    copy = host_copy.copy_to_host
    monkeypatch.setattr(host_copy, "copy_to_host", lambda t: copies.append(t.shape) or copy(t))
    return register_host_reading(monkeypatch), copies


@pytest.mark.parametrize("model", ["torchtitan", "mixtral"])
def test_gemms_reading_offs_on_the_host_read_one_copy_forward_and_backward(host_reading, model):
    seen, copies = host_reading
    torch.manual_seed(0)
    if model == "torchtitan":
        moe = TitanMoE(HIDDEN, INTERMEDIATE, experts=EXPERTS, top_k=TOP_K).to(DEVICE, torch.bfloat16)
    else:
        moe = hf_sparse_moe("mixtral", HIDDEN, INTERMEDIATE, EXPERTS, TOP_K).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, TOKENS, HIDDEN, device=DEVICE, dtype=torch.bfloat16)
    counts = assert_matches_inductor(moe, [x], options=FORCED)
    assert counts["grouped_mm_host_offs"] == 1  # one offs, read by every GEMM of the layer
    gemms = sum(1 for kernel, _ in seen if kernel == "grouped_gemm")
    assert gemms >= 4 and any(kernel == "grouped_gemm_wgrad" for kernel, _ in seen), seen  # forward and backward
    assert all(with_copy for _, with_copy in seen), seen
    assert copies == [torch.Size([EXPERTS])]  # made once, in the forward: the backward reads it saved


def test_gemms_compiled_for_cuda_graphs_take_no_host_copy(host_reading):
    """A capture declines the implementations reading offs on the host; a host tensor in the graph would keep the
    graph out of it."""
    seen, copies = host_reading
    torch.manual_seed(0)
    moe = TitanMoE(HIDDEN, INTERMEDIATE, experts=EXPERTS, top_k=TOP_K).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, TOKENS, HIDDEN, device=DEVICE, dtype=torch.bfloat16)
    with torch._inductor.config.patch({"triton.cudagraphs": True}):  # as compile_fx patches it from the options
        counts = rewrites_without_compiling(moe, [x], options=FORCED)
    assert counts["grouped_mm_host_offs"] == 0 and counts["grouped_mm"] == 3
    assert rewrites_without_compiling(moe, [x], options=FORCED)["grouped_mm_host_offs"] == 1


def test_gemms_launching_ahead_take_no_host_copy(host_reading):
    seen, copies = host_reading
    torch.manual_seed(0)
    moe = TitanMoE(HIDDEN, INTERMEDIATE, experts=EXPERTS, top_k=TOP_K).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, TOKENS, HIDDEN, device=DEVICE, dtype=torch.bfloat16)
    counts = assert_matches_inductor(moe, [x], options={"impl": "reference"})
    assert counts["grouped_mm_host_offs"] == 0
    assert turbo_inductor.kernel_calls()[("grouped_gemm", "reference")] >= 4
    assert seen == copies == []


@pytest.mark.skipif(DEVICE != "cuda", reason="one cuBLAS GEMM per group runs on GPUs only")
def test_one_gemm_per_group_reads_offs_without_a_sync_in_training(monkeypatch):
    """``vendor_per_group`` in a compiled Mixtral layer: every read of offs, forward and backward, is of the host copy
    (queued without a sync); outputs and gradients are Inductor's."""
    reads = []
    read = host_copy.values
    monkeypatch.setattr(host_copy, "values", lambda t: reads.append(host_copy.given(t) is not None) or read(t))
    torch.manual_seed(0)
    moe = hf_sparse_moe("mixtral", HIDDEN, INTERMEDIATE, EXPERTS, TOP_K).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, TOKENS, HIDDEN, device=DEVICE, dtype=torch.bfloat16)
    options = {"impl": {kernel: "vendor_per_group" for kernel in KERNELS}}
    counts = assert_matches_inductor(moe, [x], options=options)
    assert counts["grouped_mm_host_offs"] == 1
    assert len(reads) >= 6 and all(reads), reads  # gate_up and down: forward, dgrad, wgrad
