"""The per-group GEMM benchmark's host side: groups padded to cuBLASLt's 16 rows, one call per non-empty group."""

from __future__ import annotations

import torch

from benchmarks.bench_grouped_per_group import PAD, padded, per_group


def test_groups_are_padded_to_whole_tiles_and_each_nonempty_group_is_called_once_with_its_rows():
    offs = torch.tensor([3, 3, 20, 40, 57], dtype=torch.int32)
    ends = padded(offs)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    assert torch.equal(counts, torch.tensor([16, 0, 32, 32, 32], dtype=torch.int32))
    assert all(c % PAD == 0 for c in counts.tolist())
    calls = []
    per_group(ends, 112, lambda g, start, end: calls.append((g, start, end)))
    assert calls == [(0, 0, 16), (2, 16, 48), (3, 48, 80), (4, 80, 112)]
