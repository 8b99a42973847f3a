"""The tests' session, shared by both test folders: ``lowering_tests/`` (the package) and ``benchmarks/tests/`` (the
harness). Triton's interpreter on a CPU, the test order and markers, each test's fresh state and its pass-failure
guard. The tests' helpers are ``turbo_inductor.testing``'s modules, imported by name."""

import logging
import os
import pathlib
import zlib

import pytest
import torch

# Without a GPU, Triton kernels run on CPU in Triton's interpreter, which must be chosen before our kernels load.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import turbo_inductor  # noqa: E402
from turbo_inductor.testing import DEVICE  # noqa: E402

# pytest hands its log capture to every logger that does not propagate, torch's structured trace log too. torch then
# builds each compile's trace records (graphs, fake tensors) for it: a quarter of a compiling test's time. Made to
# propagate, the log keeps no handler of its own and torch builds none.
logging.getLogger("torch.__trace").propagate = True

# Under pytest-xdist every worker already has a core: torch's own intra-op threads would only contend (small CPU
# ops ran ~100x slower with two workers on two cores).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    # Nor would Inductor's pool of compile subprocesses, which each worker also pays to start: compiling in the
    # worker ran 6% faster on two rewrite-test files. On a GPU the pool compiles Triton kernels in parallel: kept.
    if not torch.cuda.is_available():
        torch._inductor.config.compile_threads = 1

ROOT = pathlib.Path(__file__).resolve().parent

# Files whose tests compile whole models, the longest first (seconds to minutes each on CPU), by their path from here.
# They run before the rest: pytest-xdist hands tests out in this order, and a long test handed out last kept one worker
# busy for minutes after the other had finished (with --dist worksteal the idle worker then takes the short tests
# still queued).
LONG_FIRST = (
    "lowering_tests/models/test_hf_llama.py",
    "benchmarks/tests/test_main_job.py",
    "lowering_tests/passes/test_fp8_producers.py",
    "lowering_tests/models/test_hf_models.py",
    "lowering_tests/passes/test_moe.py",
    "lowering_tests/passes/test_fp8_linear.py",
    "lowering_tests/system/test_distributed.py",
    "lowering_tests/passes/test_gemm_allreduce.py",
    "lowering_tests/passes/test_gemm_allreduce_dgrad.py",
    "lowering_tests/kernels/test_gemm_push.py",
)


# Files whose tests take seconds: ``pytest -m quick`` runs them (about two minutes) for local iteration.
QUICK = (
    "lowering_tests/system/test_pipeline.py",
    "lowering_tests/system/test_docs.py",
    "benchmarks/tests/test_benchmark_report.py",
    "benchmarks/tests/test_goals.py",
    "benchmarks/tests/test_cost_table.py",
    "lowering_tests/ops/test_bad_input.py",
    "lowering_tests/kernels/test_dispatcher.py",
    "lowering_tests/system/test_backend.py",
    "lowering_tests/ops/test_rmsnorm.py",
    "lowering_tests/ops/test_glu.py",
    "lowering_tests/kernels/test_fp8_gemm.py",
    "lowering_tests/ops/test_traced_ops.py",
)


# Files whose tests every session with a GPU runs in its first call (``pytest -m gpu_quick``, at most three minutes on
# one H200): the kernels at real sizes and a compiled Llama block, our ops traced into compiled graphs, the pipeline
# and the backend.
GPU_QUICK = (
    "lowering_tests/system/test_gpu.py",
    "lowering_tests/ops/test_traced_ops.py",
    "lowering_tests/system/test_pipeline.py",
    "lowering_tests/system/test_backend.py",
)


def _path(item) -> str:
    """The test's file, by its path from the repository's root."""
    return item.path.resolve().relative_to(ROOT).as_posix()


def pytest_collection_modifyitems(config, items):
    # The long fuzzing run is deselected unless the -m expression names it (pytest -m fuzz).
    if "fuzz" not in (config.option.markexpr or ""):
        long_fuzz = [item for item in items if item.get_closest_marker("fuzz")]
        if long_fuzz:
            config.hook.pytest_deselected(items=long_fuzz)
            items[:] = [item for item in items if not item.get_closest_marker("fuzz")]
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(_path(item), len(LONG_FIRST)))
    for item in items:
        if _path(item) in QUICK:
            item.add_marker(pytest.mark.quick)
        if _path(item) in GPU_QUICK:
            item.add_marker(pytest.mark.gpu_quick)


# Op tests run where the Triton kernels really run (turbo_inductor.testing.DEVICE): the GPU when there is one, else
# the CPU interpreter.
if DEVICE == "cpu":
    # Inductor's C++ without SIMD: its code generation and compile take about a fifth less, and these tests check
    # our rewrites and numerics, not Inductor's vectorizer.
    torch._inductor.config.cpp.simdlen = 1


@pytest.fixture(autouse=True)
def fresh_state(request):
    """Each test starts with no compile records, no kernel-call counts and no compiled frames; its random inputs come
    from a seed of its own name. On CPU graphs compiled before are reused from the FX graph and AOTAutograd caches:
    the passes run before the lookup, so rewrites are counted on a hit too. On a GPU kernels traced into a graph are
    counted when it compiles, which a hit would skip: caches off. A pass that raises is skipped with a warning and
    its graph restored, so a compiled model's test would pass without it: any such failure fails the test, unless it
    is marked ``pass_failures``."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    torch._dynamo.reset()
    turbo_inductor.reset_records()
    turbo_inductor.reset_kernel_calls()
    cached = DEVICE == "cpu"
    with (
        torch._inductor.config.patch(fx_graph_cache=cached),
        torch._functorch.config.patch(enable_autograd_cache=cached),
    ):
        yield
    torch._dynamo.reset()
    failures = [failure for record in turbo_inductor.compile_records() for failure in record.failures]
    if failures and not request.node.get_closest_marker("pass_failures"):
        pytest.fail(f"a pass failed and was skipped: {failures}")


@pytest.fixture(autouse=True)
def no_cost_tables(request, monkeypatch):
    """The fp8 option's ``"auto"`` takes FP8 as asked, as on a GPU without a cost table: on an H200 its table would
    keep a test's small experts in bf16, and the test would check bf16 for FP8. Tests marked ``cost_tables`` read
    the shipped tables."""
    if not request.node.get_closest_marker("cost_tables"):
        from turbo_inductor import costs

        monkeypatch.setattr(costs, "table", lambda slug: None)


@pytest.fixture(autouse=True)
def reference_kernels_on_cpu(request, monkeypatch):
    """Tests marked ``reference_kernels`` check whole models: what the passes fuse and how it is wired. On CPU they
    run every kernel's reference implementation: interpreted, a Triton kernel runs a program per row, seconds per
    step of a tiny model. The kernel, op and rewrite tests run the Triton kernels interpreted; a GPU runs them all."""
    if DEVICE == "cpu" and request.node.get_closest_marker("reference_kernels"):
        from turbo_inductor.kernels import registry

        monkeypatch.setenv(registry.IMPL_ENV, "reference")


@pytest.fixture
def fake_group():
    """One process in a fake process group of two (graph-level tests of collectives: its all-reduce returns its
    input)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield dist.group.WORLD
    dist.destroy_process_group()
