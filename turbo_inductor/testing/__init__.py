"""Models the tests and benchmarks share, written as real training code writes them. Weights are random."""
