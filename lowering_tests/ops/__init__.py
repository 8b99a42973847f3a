"""Tests of our custom ops (``turbo_inductor/ops/``): numerics against float64, opcheck, bad input."""
