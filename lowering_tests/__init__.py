"""The package's tests, by layer: ``ops/`` (our custom ops), ``kernels/`` (their implementations), ``passes/`` (the
rewrites, and the rewrite fuzzer of ``fuzz/``), ``models/`` (whole transformers models) and ``system/`` (the backend,
the pipeline, reliability, distributed runs, the docs, the versions, the GPU suite). Their helpers are
``turbo_inductor.testing``'s modules, imported by name; the session (fixtures, markers, the file lists) is the
root ``conftest.py``."""
