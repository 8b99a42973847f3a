import os

import pytest
import torch

# Without a GPU, Triton kernels run on CPU in Triton's interpreter, which must be chosen before our kernels load.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import turbo_inductor  # noqa: E402

# Gates from shared/targets.md (against a float64 reference).
TOLERANCE = {torch.float64: 1e-7, torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}
# Under pytest-xdist every worker already has a core: torch's own intra-op threads would only contend (small CPU
# ops ran ~100x slower with two workers on two cores).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# Op tests run where the Triton kernels really run: the GPU when there is one, else the CPU interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def assert_close(actual, expected, dtype=None):
    tol = TOLERANCE[dtype or actual.dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol)


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test starts with no compile records, no kernel-call counts and no compiled frames, and compiles without
    the FX graph and AOTAutograd caches: traced kernels are counted when a graph is compiled, which a hit on another
    test's graph would skip. (Compiled kernels are still cached; the cache test turns the two back on.)"""
    torch._dynamo.reset()
    turbo_inductor.reset_records()
    turbo_inductor.reset_kernel_calls()
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()
