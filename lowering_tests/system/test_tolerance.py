"""The spread two SNRs of one result show by chance, which the model tests allow between a fused run and its
emulation: drawn, not assumed."""

import statistics

import torch

from turbo_inductor.testing.tolerance import snr_db, snr_spread_db


def test_two_noisy_snrs_of_a_small_result_differ_by_chance_within_the_spread_and_often_beyond_half_a_db():
    torch.manual_seed(0)
    elements, trials = 64, 400
    want = torch.randn(trials, elements, dtype=torch.float64)
    # Two runs with independent noise at the same level, about 18 dB below the signal.
    first, second = (want + 0.125 * torch.randn_like(want) for _ in range(2))
    gaps = [snr_db(a, w) - snr_db(b, w) for a, b, w in zip(first, second, want)]
    sigma = statistics.pstdev(gaps)
    # The spread is two sigma of this difference: within 25% of what the draw shows.
    assert 0.75 <= snr_spread_db(elements) / (2 * sigma) <= 1.25, sigma
    assert sum(abs(g) > 0.5 for g in gaps) > trials / 2  # a fixed 0.5 dB margin would fail by chance
    assert sum(abs(g) > snr_spread_db(elements) for g in gaps) < trials / 10
    assert snr_spread_db(10**6) == 0.5
