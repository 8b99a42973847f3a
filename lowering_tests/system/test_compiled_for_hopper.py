"""Every Triton kernel as an H100 or H200 compiles it, checked on a machine without one
(``turbo_inductor.testing.hopper``: the launches' real configurations at model sizes, Triton's compiler, ptxas)."""

from __future__ import annotations

from turbo_inductor.testing import hopper


def test_every_kernel_compiles_for_hopper_within_its_limits():
    """Each launch fits an SM (shared memory, registers for its warps), spills nothing and stores no single bytes: a
    kernel that failed one of these would fail or crawl only on the GPU machine. torch's analysis of what a traced
    launch writes succeeds (where it fails, every tensor counts as written and a compiled graph copies the inputs
    first); launches with tensor descriptors are never traced, and torch 2.11's analysis fails on them. Each kernel the
    Triton implementations launch is compiled by some case, and declares what it writes as torch's analysis finds."""
    launches = hopper.facts_in_a_process()
    assert {f["kernel"] for f in launches} == hopper.launched_kernels()
    for f in launches:
        assert f["shared"] <= hopper.MAX_SHARED and f["registers"] * 32 * f["num_warps"] <= 65536, f
        assert f["spilled"] == 0 and f["byte_stores"] == 0, f
        assert f["descriptors"] or set(f["writes"]) < set(f["tensors"]), f
        # What torch 2.11 takes instead of its analysis (access_analysis.writes): every kernel declares it, exactly.
        assert f["declared"] is not None and (f["descriptors"] or f["declared"] == f["writes"]), f
