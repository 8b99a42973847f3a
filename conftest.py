"""The tests' session, shared by both test folders: ``lowering_tests/`` (the package) and ``benchmarks/tests/`` (the
harness). Triton's interpreter on a CPU, the test order and markers, each test's fresh state and its pass-failure
guard, and the helpers the tests import by name (``from conftest import DEVICE``)."""

import logging
import os
import zlib

import pytest
import torch

# Without a GPU, Triton kernels run on CPU in Triton's interpreter, which must be chosen before our kernels load.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import turbo_inductor  # noqa: E402

# pytest hands its log capture to every logger that does not propagate, torch's structured trace log too. torch then
# builds each compile's trace records (graphs, fake tensors) for it: a quarter of a compiling test's time. Made to
# propagate, the log keeps no handler of its own and torch builds none.
logging.getLogger("torch.__trace").propagate = True

# Each dtype's tolerance against a float64 reference: Primus-Turbo's test gates (bf16 and fp16 1e-2, fp32 1e-4).
TOLERANCE = {torch.float64: 1e-7, torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}
# Under pytest-xdist every worker already has a core: torch's own intra-op threads would only contend (small CPU
# ops ran ~100x slower with two workers on two cores).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    # Nor would Inductor's pool of compile subprocesses, which each worker also pays to start: compiling in the
    # worker ran 6% faster on two rewrite-test files. On a GPU the pool compiles Triton kernels in parallel: kept.
    if not torch.cuda.is_available():
        torch._inductor.config.compile_threads = 1

# Files whose tests compile whole models, the longest first (seconds to minutes each on CPU). They run before the
# rest: pytest-xdist hands tests out in this order, and a long test handed out last kept one worker busy for minutes
# after the other had finished (with --dist worksteal the idle worker then takes the short tests still queued).
LONG_FIRST = (
    "test_hf_llama.py",
    "test_main_job.py",  # benchmarks/tests
    "test_fp8_producers.py",
    "test_hf_models.py",
    "test_moe.py",
    "test_fp8_linear.py",
    "test_gemm_allreduce.py",
    "test_gemm_allreduce_dgrad.py",
    "test_gemm_push.py",
)


# Files whose tests take seconds: ``pytest -m quick`` runs them (about two minutes) for local iteration.
QUICK = (
    "test_pipeline.py",
    "test_docs.py",
    "test_benchmark_report.py",  # benchmarks/tests, as the two below
    "test_goals.py",
    "test_cost_table.py",
    "test_bad_input.py",
    "test_dispatcher.py",
    "test_backend.py",
    "test_rmsnorm_ops.py",
    "test_glu_ops.py",
    "test_fp8_gemm_kernels.py",
    "test_traced_ops.py",
)


# Files whose tests every session with a GPU runs in its first call (``pytest -m gpu_quick``, at most three minutes on
# one H200): the kernels at real sizes and a compiled Llama block, our ops traced into compiled graphs, the pipeline
# and the backend.
GPU_QUICK = ("test_gpu.py", "test_traced_ops.py", "test_pipeline.py", "test_backend.py")


def pytest_collection_modifyitems(config, items):
    # The long fuzzing run is deselected unless the -m expression names it (pytest -m fuzz).
    if "fuzz" not in (config.option.markexpr or ""):
        long_fuzz = [item for item in items if item.get_closest_marker("fuzz")]
        if long_fuzz:
            config.hook.pytest_deselected(items=long_fuzz)
            items[:] = [item for item in items if not item.get_closest_marker("fuzz")]
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))
    for item in items:
        if item.path.name in QUICK:
            item.add_marker(pytest.mark.quick)
        if item.path.name in GPU_QUICK:
            item.add_marker(pytest.mark.gpu_quick)


# Op tests run where the Triton kernels really run: the GPU when there is one, else the CPU interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # Inductor's C++ without SIMD: its code generation and compile take about a fifth less, and these tests check
    # our rewrites and numerics, not Inductor's vectorizer.
    torch._inductor.config.cpp.simdlen = 1


def assert_close(actual, expected, dtype=None):
    tol = TOLERANCE[dtype or actual.dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol)


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


class TakingSome:
    """An implementation that takes only some of a kernel's arguments (its ``supports``), as a module of kernel
    functions for the kernel tests: a call it does not take skips the test, naming why."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, kernel: str):
        from turbo_inductor.kernels import registry

        implementation = registry.implementations(kernel)[self.name]

        def call(*args, **kwargs):
            reason = implementation.declines(*args, **kwargs)
            if reason is not None:
                pytest.skip(f"{self.name} {kernel}: {reason}")
            return implementation.fn(*args, **kwargs)

        return call


def native_on_device() -> dict:
    """{"native": its kernels} where the native extension was built and runs on DEVICE, else {}."""
    from turbo_inductor.kernels import native

    return {"native": TakingSome("native")} if native.unavailable_reason(torch.device(DEVICE)) is None else {}


@pytest.fixture
def fake_group():
    """One process in a fake process group of two (graph-level tests of collectives: its all-reduce returns its
    input)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield dist.group.WORLD
    dist.destroy_process_group()
