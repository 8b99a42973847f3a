"""Tests of the kernels' implementations (``turbo_inductor/kernels/``), called directly and through the registry."""
