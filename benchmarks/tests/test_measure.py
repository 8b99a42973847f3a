"""The main job's measurements that need no GPU: what a step saves for its backward, told apart by kind; the time
torch spends on our Triton kernels' TTIR; the benchmarks' launch-heuristic variants."""

from __future__ import annotations

import inspect
import math
import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from benchmarks.common import module_constants
from benchmarks.measure import gpu_figures, kernel_ttir, saved_for_backward


class _SavesACopyOfW(torch.autograd.Function):
    """y = x W^T, saving x twice (a view of it), W itself and a copy of W, as an FP8 linear saves W quantized."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, x[: x.shape[0] // 2], w, w * 2)
        return x @ w.t()

    @staticmethod
    def backward(ctx, dy):
        x, _, _, w2 = ctx.saved_tensors
        return dy @ w2 / 2, dy.t() @ x


class _Step:
    def __init__(self):
        self.model = torch.nn.Linear(64, 32, bias=False)
        self.x = torch.empty(16, 64)

    def draw(self, k: int) -> None:
        self.x.copy_(torch.randn(self.x.shape, generator=torch.Generator().manual_seed(k)))

    def __call__(self):
        out = _SavesACopyOfW.apply(self.x, self.model.weight)
        out.sum().backward()  # saves nothing of its own
        return out


def test_saved_memory_tells_activations_from_weight_copies_and_counts_a_storage_once():
    step = _Step()
    saved = saved_for_backward(step, step.draw)
    gib = 4 / 2**30  # bytes of an fp32 element
    assert saved["saved_gib_by_kind"] == {
        "activations float32": 16 * 64 * gib,  # x and its view: one storage
        "weights and constants float32": 32 * 64 * gib,  # W * 2; W itself is the parameter's
    }
    assert saved["saved_gib"] == sum(saved["saved_gib_by_kind"].values())
    x = step.x.clone()
    step.draw(0)
    assert torch.equal(step.x, x), "input 0 is drawn back"


def test_kernel_ttir_counts_torchs_calls_while_it_measures_and_restores_the_function(monkeypatch):
    """The main job counts torch's TTIR of user-defined Triton kernels by wrapping the module function that torch's
    analysis of a launch calls by name (``identify_mutated_tensors``, torch >= 2.13 ``identify_accessed_tensors``)."""
    from torch._higher_order_ops import triton_kernel_wrap

    analysis = getattr(triton_kernel_wrap, "identify_accessed_tensors", None)
    analysis = analysis or triton_kernel_wrap.identify_mutated_tensors
    assert "generate_ttir(" in inspect.getsource(analysis)
    calls = []
    monkeypatch.setattr(triton_kernel_wrap, "generate_ttir", lambda *args: calls.append(args) or "ttir")
    total = {"calls": 0, "distinct": 0, "seconds": 0.0}
    kernel, other = object(), object()
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        n, m = mode.shape_env.create_unbacked_symint(), mode.shape_env.create_unbacked_symint()
    bf16, fp32 = (torch.empty(4, dtype=dtype) for dtype in (torch.bfloat16, torch.float32))
    launches = [
        {"X": bf16, "n": n, "BLOCK": 64},
        {"X": torch.empty(8, dtype=torch.bfloat16), "n": m, "BLOCK": 64},  # other sizes: the same TTIR
        {"X": fp32, "n": n, "BLOCK": 64},
        {"X": bf16, "n": n, "BLOCK": 128},
    ]
    with kernel_ttir(total):
        for kwargs in launches:
            assert triton_kernel_wrap.generate_ttir(kernel, kwargs, {}) == "ttir"
        triton_kernel_wrap.generate_ttir(other, launches[0], {})
    assert triton_kernel_wrap.generate_ttir("after", {}, {}) == "ttir"
    assert total["calls"] == 5 and total["distinct"] == 4 and total["seconds"] >= 0
    assert [args[0] for args in calls] == [kernel] * 4 + [other, "after"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the profiler's GPU kernels")
def test_a_gpu_steps_kernel_table_by_name_and_by_launch_grid_agree():
    """``--kernels``: the per-kernel table and the per-launch one (from the profiler's Chrome trace) hold the same
    kernel time, each launch keyed by its grid."""
    a = torch.randn(512, 512, device="cuda")
    figures = gpu_figures(lambda: (a @ a).relu_(), 0, kernels=2)
    kernels = {name: us for name, us in figures["kernels_us"].items() if not name.startswith(("Memcpy", "Memset"))}
    assert figures["launches_us"] and all(" grid [" in launch for launch in figures["launches_us"])
    assert math.isclose(sum(figures["launches_us"].values()), sum(kernels.values()), rel_tol=0.05)


def test_module_constants_are_set_in_the_block_and_restored_after_an_error():
    module = types.SimpleNamespace(TILE=64, STAGES=3)
    with pytest.raises(RuntimeError), module_constants(module, {"TILE": 128}):
        assert (module.TILE, module.STAGES) == (128, 3)
        raise RuntimeError("a failing variant")
    assert (module.TILE, module.STAGES) == (64, 3)


def test_every_launch_heuristic_variant_names_existing_constants_and_implementations():
    """A constant renamed in the kernels would otherwise fail its column only on the GPU."""
    from benchmarks.bench_grouped_mm import HEURISTICS, heuristic_variants
    from turbo_inductor.kernels import registry

    for name, (impl, constants) in HEURISTICS.items():
        assert "," not in name, name  # --heuristics and --columns split on commas
        for kernel_impl in impl.split(","):
            kernel, implementation = kernel_impl.split("=")
            assert implementation in registry.implementations(kernel), (name, kernel_impl)
        for module, values in constants.items():
            assert all(hasattr(module, constant) for constant in values), (name, module.__name__, values)
    columns = heuristic_variants(list(HEURISTICS))
    assert len(columns) == len(HEURISTICS) and all(column.startswith("fp8 rowwise: ") for column in columns)
