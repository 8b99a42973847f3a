"""Tests of the rewrites (``turbo_inductor/passes/``): one file per pass or family, and the rewrite fuzzer."""
