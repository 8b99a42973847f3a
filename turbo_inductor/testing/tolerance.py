"""How close a result must be: each dtype's tolerance against a float64 reference, and the signal-to-noise ratio
the FP8 gates are stated in."""

import math

import torch

# Each dtype's tolerance against a float64 reference: Primus-Turbo's test gates (bf16 and fp16 1e-2, fp32 1e-4).
TOLERANCE = {torch.float64: 1e-7, torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def assert_close(actual, expected, dtype=None):
    """``actual`` within ``dtype``'s tolerance (default: its own dtype's) of ``expected``, compared in float64."""
    tol = TOLERANCE[dtype or actual.dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol)


def snr_db(got: torch.Tensor, want: torch.Tensor) -> float:
    """10 log10(|want|^2 / |got - want|^2) in float64: inf when equal, -inf when want is zero and got is not."""
    signal, noise = want.double().pow(2).sum().item(), (got.double() - want.double()).pow(2).sum().item()
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def snr_spread_db(elements: int) -> float:
    """How far two SNRs of one ``elements``-element result, each with its own FP8 noise, lie apart by chance: a noise
    power is a sum of that many squares, known to within sqrt(2 / elements) relatively, so the difference of two in
    dB spreads by about 20 / ln 10 / sqrt(elements) (one sigma). Two sigma, and 0.5 dB at least."""
    return max(0.5, 2 * 20 / math.log(10) / math.sqrt(max(elements, 1)))
