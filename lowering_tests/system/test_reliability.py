"""Reliability across the backend: the compile caches, run-to-run reproducibility, dynamic shapes for every rewrite."""

import contextlib
import dataclasses
import shutil
from typing import Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
from torch._dynamo.utils import counters

import turbo_inductor
from turbo_inductor import environment
from turbo_inductor.kernels import native, registry
from turbo_inductor.options import Options
from turbo_inductor.passes import PASSES, PassManager, manager
from turbo_inductor.testing import DEVICE, hf
from turbo_inductor.testing.compare import default_counts
from turbo_inductor.testing.llama import CONFIGS, LlamaDecoder


def tiny_decoder():
    torch.manual_seed(0)
    config = CONFIGS["tiny"]
    return LlamaDecoder(type(config)(**{**config.__dict__, "layers": 1, "hidden": 64, "intermediate": 96}))


def train_step(model, x, options=None):
    compiled = torch.compile(model, backend="primus_turbo", options=options)
    x = x.clone().requires_grad_()
    out = compiled(x)
    out.backward(torch.ones_like(out))
    return out.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def test_warm_cache_reproduces_rewrites_and_results_and_options_and_versions_invalidate_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    x = torch.randn(2, 8, 64)
    with (
        torch._inductor.config.patch(fx_graph_cache=True, fx_graph_remote_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=True),
    ):
        cold = train_step(tiny_decoder(), x)
        cold_counts = turbo_inductor.rewrite_counts()
        (cold_record,) = turbo_inductor.compile_records()
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        counters.clear()
        warm = train_step(tiny_decoder(), x)
        hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
        assert hits > 0, (dict(counters["inductor"]), dict(counters["aot_autograd"]))
        # Fused sites in the compiled graph: three norms, the last two with their residual add, and the SwiGLU.
        assert cold_counts == default_counts(rmsnorm=1, rmsnorm_residual=2, glu=1)
        assert cold_record.replaced["rmsnorm"] == 3, "the residual pass rewrote two of the norms the rmsnorm pass made"
        assert sum(n for op, n in cold_record.ops_after.items() if op.startswith("turbo_inductor.")) == 4
        assert set(cold_record.implementations) == {"rmsnorm_fwd", "rmsnorm_bwd", "glu_fwd", "glu_bwd"}
        (warm_record,) = turbo_inductor.compile_records()
        # The passes run before the cache lookup: a hit reports the rewrites and what each kernel of the graph runs,
        # forward and backward, as when compiled (torch 2.11 on an H100: AOTAutograd's cache hit, the counts kept).
        said = (dict(counters["inductor"]), dict(counters["aot_autograd"]))
        assert turbo_inductor.rewrite_counts() == cold_counts, said
        assert warm_record.implementations == cold_record.implementations, said
        cpu = torch.device("cpu")
        assert all(names == registry.candidates(k, cpu) for k, names in warm_record.implementations.items())
        for a, b in zip([cold[0], cold[1], *cold[2]], [warm[0], warm[1], *warm[2]]):
            assert torch.equal(a, b)
        torch._dynamo.reset()
        counters.clear()
        train_step(tiny_decoder(), x, {"glu": False})
        assert counters["inductor"]["fxgraph_cache_miss"] > 0, "other options, other graph: no stale hit"
        # Another version of the package (its sources make the cache key): the same rewritten graph and options, but
        # no AOTAutograd hit: its entries hold what the forward saves and how the backward calls our ops. (Inductor
        # may still reuse a graph whose text, which spells out every call of ours with its arguments, is unchanged.)
        monkeypatch.setattr(manager, "_source_hash", lambda: "another version")
        torch._dynamo.reset()
        counters.clear()
        train_step(tiny_decoder(), x)
        assert counters["aot_autograd"]["autograd_cache_hit"] == 0 < counters["aot_autograd"]["autograd_cache_miss"]


def test_the_pass_manager_pickles_alike_before_and_after_it_ran():
    """torch 2.11 pickles the Inductor config, the pass manager included, into its cache keys: what a compile
    recorded (counts, timings) must not change them, or no warm compile would ever hit."""
    import pickle

    options = Options.parse(None, PASSES)
    passes = PassManager(PASSES, options)
    before = pickle.dumps(passes)
    passes.record.counts["rmsnorm"] += 3  # as a compile records them
    passes.record.seconds["rmsnorm"] += 0.01
    assert pickle.dumps(passes) == before == pickle.dumps(PassManager(PASSES, options))
    copy = pickle.loads(before)
    assert copy.uuid() == passes.uuid() and copy.record is not passes.record


# A stand-in for a native kernel: an op of its own library, which compiled code calls directly, as it calls
# torch.ops.turbo_inductor_native's. A build without the extension has no such op.
NATIVE_CALLS = []


@torch.library.custom_op("turbo_inductor_reliability::native_rmsnorm", mutates_args=())
def native_rmsnorm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    NATIVE_CALLS.append(x.shape)
    y, _, rstd = registry.implementations("rmsnorm_fwd")["reference"].fn(x, weight, None, eps)
    return y.clone(), rstd.clone()


@native_rmsnorm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _native_rmsnorm_fwd(x, weight, residual, eps, out_dtype=None):
    assert residual is None and out_dtype is None, "the model below has no residual add, and no autocast"
    y, rstd = native_rmsnorm(x, weight, eps)
    return y, None, rstd


def test_a_warm_cache_never_serves_a_graph_calling_an_implementation_that_is_gone(tmp_path, monkeypatch):
    """A compile where a native implementation is available (traced in: the graph calls its op), then one where it
    is not, on the same warm cache: the second compiles afresh, runs without the op, and gives the same result."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    # the caches on, as on a user's machine (conftest turns them off on a GPU)
    caches = contextlib.ExitStack()
    caches.enter_context(torch._inductor.config.patch(fx_graph_cache=True, fx_graph_remote_cache=False))
    caches.enter_context(torch._functorch.config.patch(enable_autograd_cache=True))
    native_impl = registry.implementations("rmsnorm_fwd")["native"]
    built = dataclasses.replace(
        native_impl, fn=_native_rmsnorm_fwd, priority=100, unavailable_reason=lambda device: None, supports=None
    )
    model = nn.Sequential(nn.Linear(32, 32), nn.RMSNorm(32, eps=1e-6))
    x = torch.randn(4, 32)
    results = []
    try:
        for available in (True, False):
            torch._dynamo.reset()
            counters.clear()
            NATIVE_CALLS.clear()
            with monkeypatch.context() as patch:
                if available:
                    patch.setitem(registry._IMPLS["rmsnorm_fwd"], "native", built)
                registry._candidates.cache_clear()
                model.zero_grad(set_to_none=True)
                results.append(train_step(model, x))
            assert bool(NATIVE_CALLS) is available, NATIVE_CALLS
            assert turbo_inductor.compile_records()[-1].implementations["rmsnorm_fwd"] == (
                ["native"] if available else [registry.candidates("rmsnorm_fwd", torch.device("cpu"))[0]]
            )
        assert counters["inductor"]["fxgraph_cache_hit"] == counters["aot_autograd"]["autograd_cache_hit"] == 0
        assert counters["inductor"]["fxgraph_cache_miss"] > 0
    finally:
        registry._candidates.cache_clear()
        caches.close()
    for a, b in zip([results[0][0], results[0][1], *results[0][2]], [results[1][0], results[1][1], *results[1][2]]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", ["torch", "triton", "device", "native build"])
def test_the_cache_tag_covers_the_versions_the_device_and_the_native_build(monkeypatch, change):
    tag = PassManager(PASSES, Options.parse(None, PASSES)).uuid
    before = tag()
    if change == "torch":
        monkeypatch.setattr(torch, "__version__", "2.99.0")
    elif change == "triton":
        monkeypatch.setattr(triton, "__version__", "9.9.9")
    elif change == "device":
        monkeypatch.setattr(environment, "device", lambda: (torch.device("cpu"), "cuda:0 another GPU (sm_100)"))
    else:
        monkeypatch.setattr(native, "build_hash", lambda: "another build")
    assert tag() != before


def test_an_ops_schema_or_fake_edited_changes_the_sources_hash(tmp_path):
    """The sources hash tags the cache key (the warm-cache test above shows a new tag misses): an op's schema or
    fake edited between versions gives a new tag."""
    copy = tmp_path / "turbo_inductor"
    shutil.copytree(manager.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    source_hash = manager._source_hash.__wrapped__  # uncached: the files change below
    assert source_hash(copy) == manager._source_hash()
    rmsnorm = copy / "ops" / "rmsnorm.py"
    source = rmsnorm.read_text()
    hashes = {source_hash(copy)}
    for old, new in [
        (
            '    x: Tensor, weight: Optional[Tensor], eps: float, impl: str = "auto", out_dtype',
            '    x: Tensor, weight: Optional[Tensor], eps: float = 1e-6, impl: str = "auto", out_dtype',
        ),
        ("torch.empty_like(x, memory_format=torch.contiguous_format)", "torch.empty_like(x)"),
    ]:
        assert old in source
        rmsnorm.write_text(source.replace(old, new))
        hashes.add(source_hash(copy))
    assert len(hashes) == 3


def test_compiled_forward_and_backward_are_bitwise_reproducible():
    """Every kernel is deterministic (no atomics; dweight and dprobs reduce in a fixed order)."""
    model, x = tiny_decoder(), torch.randn(2, 8, 64)
    first = train_step(model, x)
    model.zero_grad(set_to_none=True)
    second = train_step(model, x)
    for a, b in zip([first[0], first[1], *first[2]], [second[0], second[1], *second[2]]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class FP8MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def test_fp8_rewrite_with_dynamic_batch_and_sequence_does_not_recompile():
    model = FP8MLP()
    compiled = torch.compile(model, backend="primus_turbo", options={"fp8": "rowwise", "impl": "reference"})
    for batch, seq in [(2, 3), (3, 5), (4, 7)]:
        x = torch.randn(batch, seq, 64)
        torch._dynamo.mark_dynamic(x, 0), torch._dynamo.mark_dynamic(x, 1)
        out = compiled(x)
        expected = model(x)
        assert out.shape == expected.shape
        assert (out - expected).pow(2).sum() < 10**-2.5 * expected.pow(2).sum(), "25 dB"
        out.sum().backward()
    assert len(turbo_inductor.compile_records()) == 1, "a new size must not recompile"
    assert turbo_inductor.rewrite_counts()["fp8"] == 2


@pytest.mark.parametrize("op", ["rmsnorm", "glu", "fp8_linear"])
def test_inf_in_one_row_stays_in_that_row(op):
    """A defined result for non-finite input: it propagates to its own row (block), never to the others."""
    x = torch.randn(4, 64)
    x[1, 5] = float("inf")
    if op == "rmsnorm":
        y = turbo_inductor.ops.rmsnorm(x, torch.randn(64))
    elif op == "glu":
        y = turbo_inductor.ops.glu_fused(x)
    else:
        y = turbo_inductor.ops.fp8_linear(x, torch.randn(32, 64), None, "rowwise", impl="reference")
    assert torch.isfinite(y[[0, 2, 3]]).all()
    assert not torch.isfinite(y[1]).all()


def _forward_and_backward(model, x, rewrite_options=None):
    """The forward and backward graphs of ``model`` as AOTAutograd's min-cut partitioner (Inductor's) splits them,
    with the rewrites applied first when ``rewrite_options`` is given."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._functorch.aot_autograd import aot_module_simplified

    from turbo_inductor.options import Options
    from turbo_inductor.passes import PASSES, PassManager

    graphs = []

    def backend(gm, inputs):
        if rewrite_options is not None:
            PassManager(PASSES, Options.parse(rewrite_options, PASSES))(gm.graph)
            gm.recompile()

        def compiler(graph_module, _):
            graphs.append(graph_module)
            return make_boxed_func(graph_module.forward)

        return aot_module_simplified(
            gm, inputs, fw_compiler=compiler, bw_compiler=compiler, partition_fn=min_cut_rematerialization_partition
        )

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x).sum().backward()
    forward, backward = graphs
    return forward, backward


def _saved_for_backward(model, x, rewrite_options=None):
    """Bytes of the tensors the forward graph saves for backward (its outputs after the user's one)."""
    forward, _ = _forward_and_backward(model, x, rewrite_options)
    outputs = next(n for n in forward.graph.nodes if n.op == "output").args[0]
    saved = [o.meta["val"] for o in outputs[1:] if isinstance(o.meta.get("val"), torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in saved)


@pytest.mark.parametrize("impl", ["triton", "reference"])  # ops as calls (interpreter) / traced into the graph
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_ops_save_no_more_for_backward_than_inductor(impl, dtype):
    model = LlamaDecoder(type(CONFIGS["tiny"])(hidden=128, intermediate=256, heads=4, kv_heads=2, layers=2))
    model = model.to(DEVICE, dtype)
    x = torch.randn(2, 32, 128, device=DEVICE, dtype=dtype, requires_grad=True)
    unfused = _saved_for_backward(model, x)
    fused = _saved_for_backward(model, x, {"impl": impl})
    assert turbo_inductor.rewrite_counts() == default_counts(rmsnorm=1, rmsnorm_residual=4, glu=2)
    assert 0 < fused <= unfused, (fused, unfused)


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_a_residual_sum_only_the_norm_reads_gets_no_zero_filled_gradient(impl):
    """The final norm's rmsnorm(x + residual): nothing else reads the sum, so its backward gets no gradient for it
    (None), not a full-size zero tensor written and read for nothing (Inductor's unfused backward has none)."""
    model = LlamaDecoder(type(CONFIGS["tiny"])(hidden=128, intermediate=256, heads=4, kv_heads=2, layers=1))
    model = model.to(DEVICE)
    x = torch.randn(2, 32, 128, device=DEVICE, requires_grad=True)
    for options in (None, {"impl": impl}):
        _, backward = _forward_and_backward(model, x, options)
        fills = (torch.ops.aten.full.default, torch.ops.aten.zeros.default)
        zeros = [n for n in backward.graph.nodes if n.target in fills and n.meta["val"].numel() >= x.numel()]
        assert not zeros, (options, [n.format_node() for n in zeros])
    assert turbo_inductor.rewrite_counts()["rmsnorm_residual"] == 2


def test_info_prints_what_a_bug_report_needs(capsys, monkeypatch):
    """``python -m turbo_inductor.info``: versions, the device, whether the native kernels are built and why not, the
    environment hash the cache key holds, and per kernel the implementations ``auto`` tries, the first one chosen."""
    import runpy

    monkeypatch.setenv(registry.IMPL_ENV, "rmsnorm_fwd=reference")
    registry._candidates.cache_clear()
    try:
        runpy.run_module("turbo_inductor.info", run_name="__main__")
    finally:
        monkeypatch.delenv(registry.IMPL_ENV)
        registry._candidates.cache_clear()
    text = capsys.readouterr().out
    assert f"torch {torch.__version__}, triton {triton.__version__}" in text
    assert f"\ndevice: {environment.device()[1]}\n" in text
    built = native.load_error() is None
    assert (
        "native kernels: built (sha256 " if built else "native kernels: the native extension is not built ("
    ) in text
    assert "\nenvironment hash (in the compile cache key): " in text
    assert "TURBO_INDUCTOR_IMPL=rmsnorm_fwd=reference forces" in text
    assert "\n  rmsnorm_fwd: auto reference; available " in text
    device = environment.device()[0]
    for kernel in set(registry.kernels()) - {"rmsnorm_fwd"}:
        assert f"\n  {kernel}: auto {registry.candidates(kernel, device)[0]}" in text


@pytest.mark.reference_kernels
def test_a_training_loop_over_eight_sequence_lengths_compiles_at_most_twice():
    """A tiny Hugging Face Llama trained on 8 sequence lengths with ``dynamic=None`` (the default): one graph for the
    first length and one dynamic graph that serves the other seven, each with its fusions. Hitting the recompile
    limit raises here instead of falling back to eager."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = hf.build("llama3-8b", 1, tiny=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        compiled = torch.compile(model, backend="primus_turbo")
        for seq in (5, 7, 9, 12, 16, 17, 23, 31):
            ids = torch.randint(0, hf.TINY["vocab_size"], (2, seq))
            compiled(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert (len(turbo_inductor.compile_records()), counters["stats"]["unique_graphs"]) == (2, 2)
    assert all(record.counts["glu"] == 1 for record in turbo_inductor.compile_records())  # each graph fused


# ---- determinism: every op family, forward and backward, under torch.use_deterministic_algorithms(True) --------


def _randn(gen, *shape, grad=True):
    return torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_(grad)


def _offs(sizes):
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)


def _routing(gen):
    """x [6, 32], the router's top-2 choices of 3 experts and their weights."""
    indices = torch.stack([torch.randperm(3, generator=gen)[:2] for _ in range(6)]).to(DEVICE)
    return _randn(gen, 6, 32), indices, _randn(gen, 6, 2)


def _moe(x, indices, weights):
    """Permute, the experts' rows scaled (a stand-in for the experts), combine: the MoE glue, backward too."""
    x_sorted, _, _, _, positions = turbo_inductor.ops.moe_permute(x, indices, None, 3)
    return turbo_inductor.ops.moe_combine(x_sorted * 1.5, weights, positions)


ops_ = turbo_inductor.ops
# name -> (the op's node view, whose kernels it declares; the call; its inputs from a generator)
DETERMINISM = {
    "rmsnorm": ("RMSNormNode", lambda x, w: ops_.rmsnorm(x, w), lambda g: [_randn(g, 8, 64), _randn(g, 64)]),
    "rmsnorm_residual": (
        "RMSNormResidualNode",
        lambda x, r, w: ops_.rmsnorm_residual(x, r, w),
        lambda g: [_randn(g, 8, 64), _randn(g, 8, 64), _randn(g, 64)],
    ),
    "rmsnorm_fp8": (
        "RMSNormFP8Node",
        lambda x, r, w: ops_.rmsnorm_fp8(x, r, w, 1e-6, "rowwise"),
        lambda g: [_randn(g, 8, 64), _randn(g, 8, 64), _randn(g, 64)],
    ),
    "swiglu": ("GLUNode", lambda a, b: ops_.swiglu(a, b), lambda g: [_randn(g, 8, 64), _randn(g, 8, 64)]),
    "glu_fused": (
        "GLUFusedNode",
        lambda x, p: ops_.glu_fused(x, p),
        lambda g: [_randn(g, 8, 128), _randn(g, 8)],
    ),
    "glu_fp8": ("GLUFP8Node", lambda a, b: ops_.glu_fp8(a, b), lambda g: [_randn(g, 8, 64), _randn(g, 8, 64)]),
    "fp8_linear": (
        "FP8LinearNode",
        lambda x, w, b: ops_.fp8_linear(x, w, b, "rowwise"),
        lambda g: [_randn(g, 16, 32), _randn(g, 32, 32), _randn(g, 32)],
    ),
    "grouped_mm": (
        "GroupedMMNode",
        lambda x, w, offs: ops_.grouped_mm(x, w, offs),
        lambda g: [_randn(g, 20, 32), _randn(g, 3, 32, 16), _offs([7, 0, 11])],
    ),
    "fp8_grouped_mm": (
        "FP8GroupedMMNode",
        lambda x, w, offs: ops_.fp8_grouped_mm(x, w, offs, "rowwise"),
        lambda g: [_randn(g, 20, 32), _randn(g, 3, 32, 32), _offs([7, 0, 11])],
    ),
    "moe_permute_and_combine": ("MoEPermuteNode", _moe, _routing),
    "gemm_allreduce": (
        "GemmAllReduceNode",
        lambda x, w, b: ops_.gemm_allreduce(x, w, b),
        lambda g: [_randn(g, 16, 32), _randn(g, 24, 32), _randn(g, 24)],
    ),
    "linear_dgrad_allreduce": (
        "LinearDgradAllReduceNode",
        lambda x, w, b: ops_.linear_dgrad_allreduce(x, w, b),
        lambda g: [_randn(g, 16, 32), _randn(g, 24, 32), _randn(g, 24)],
    ),
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8)


@pytest.mark.parametrize("case", sorted(DETERMINISM))
def test_every_op_is_bitwise_reproducible_forward_and_backward_under_deterministic_algorithms(
    fake_group, monkeypatch, case
):
    """Two runs of each op, forward and backward (the weight gradients' sums and the MoE combine's included), give the
    same bits; deterministic mode also fills new tensors with NaN, so a value left unwritten shows as not finite.
    The kernels that ran are among those the op's node view declares (``CompileRecord.implementations``)."""
    from turbo_inductor.ops.node import _VIEWS

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic mode asks of cuBLAS's GEMMs
    view_name, call, make_inputs = DETERMINISM[case]
    view = next(v for v in _VIEWS.values() if v.__name__ == view_name)
    runs = []
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            gen = torch.Generator().manual_seed(0)
            inputs = make_inputs(gen)
            outs = call(*inputs)
            outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
            differentiable = [o for o in outs if o.requires_grad]
            cotangents = [torch.randn(o.shape, generator=gen).to(o) for o in differentiable]
            wanting = [t for t in inputs if t.requires_grad]
            grads = torch.autograd.grad(differentiable, wanting, cotangents)
            runs.append([*outs, *grads])
    finally:
        torch.use_deterministic_algorithms(before)
    for i, (first, second) in enumerate(zip(*runs)):
        assert torch.equal(_bits(first), _bits(second)), f"{case}: result {i} differs between two runs"
        assert torch.isfinite(first.float()).all(), f"{case}: result {i} is not finite"
    ran = {kernel for kernel, _ in turbo_inductor.kernel_calls()}
    assert ran and ran <= set(view.kernels), (ran, view.kernels)
