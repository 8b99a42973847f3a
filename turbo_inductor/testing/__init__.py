"""Models the tests and benchmarks share, written the way real training code writes them (random weights)."""
