"""The backend itself: registration, options and environment, logging, fallback on a failing pass, cache key."""

import importlib.metadata
import logging
import os
import warnings

import pytest
import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor import backend
from turbo_inductor.kernels.triton import STATIC_LAUNCH_ENV, default_to_static_launch
from turbo_inductor.options import Options
from turbo_inductor.passes import PASSES, PassManager
from turbo_inductor.passes.rmsnorm import RMSNormPass
from turbo_inductor.testing.compare import assert_matches_inductor, default_counts, kernel_calls


def norm_model():
    return nn.Sequential(nn.Linear(32, 32), nn.RMSNorm(32, eps=1e-6))


def run(options=None):
    model, x = norm_model(), torch.randn(4, 32)
    torch.testing.assert_close(
        torch.compile(model, backend="primus_turbo", options=options)(x), model(x), rtol=1e-4, atol=1e-4
    )


def test_registered_by_entry_point_only():
    names = [e.name for e in importlib.metadata.entry_points(group="torch_dynamo_backends")]
    assert names.count("primus_turbo") == 1
    assert "primus_turbo" in torch._dynamo.list_backends(exclude_tags=())


def test_log_line_and_counts(caplog):
    with caplog.at_level(logging.INFO, logger="turbo_inductor"):
        run()
    assert "primus_turbo: replaced 1 rmsnorm" in caplog.text
    assert turbo_inductor.rewrite_counts() == default_counts(rmsnorm=1)


def test_pass_can_be_disabled_by_env_and_options_win(monkeypatch):
    monkeypatch.setenv("TURBO_INDUCTOR_RMSNORM", "0")
    run()
    assert turbo_inductor.rewrite_counts() == {k: n for k, n in default_counts().items() if k != "rmsnorm"}
    torch._dynamo.reset()
    turbo_inductor.reset_records()
    run({"rmsnorm": True})
    assert turbo_inductor.rewrite_counts()["rmsnorm"] == 1


def test_impl_option_reaches_forward_and_backward():
    model = norm_model()
    x = torch.randn(4, 32, requires_grad=True)
    torch.compile(model, backend="primus_turbo", options={"impl": "reference"})(x).sum().backward()
    assert set(turbo_inductor.kernel_calls()) == {("rmsnorm_fwd", "reference"), ("rmsnorm_bwd", "reference")}


def test_inductor_options_pass_through():
    run({"max_autotune": False, "triton.cudagraphs": False})
    assert turbo_inductor.rewrite_counts()["rmsnorm"] == 1


@pytest.mark.parametrize("hip", [None, "6.4"])
@pytest.mark.parametrize("options", [None, {"static_launch_user_defined_triton_kernels": False}])
def test_our_kernels_launch_statically_unless_told_or_on_rocm(monkeypatch, hip, options):
    """Inductor's static launcher spares a host-compiler build per kernel signature (kernels/triton); the user's own
    setting wins, and ROCm keeps Triton's launcher."""
    seen = []

    def compile_fx(gm, example_inputs, config_patches):
        seen.append(config_patches)
        return gm.forward

    monkeypatch.setattr(backend, "compile_fx", compile_fx)
    monkeypatch.setattr(torch.version, "hip", hip)
    run(options)
    (patches,) = seen
    expected = False if options else hip is None
    assert patches.get("static_launch_user_defined_triton_kernels", False) is expected


@pytest.mark.parametrize("hip, preset, expected", [(None, None, "1"), (None, "0", "0"), ("6.4", None, None)])
def test_compile_workers_launch_our_kernels_statically_unless_told_or_on_rocm(monkeypatch, hip, preset, expected):
    """Inductor's compile workers read the setting from the environment as they start (kernels/triton)."""
    monkeypatch.delenv(STATIC_LAUNCH_ENV, raising=False)
    if preset is not None:
        monkeypatch.setenv(STATIC_LAUNCH_ENV, preset)
    monkeypatch.setattr(torch.version, "hip", hip)
    default_to_static_launch()
    assert os.environ.get(STATIC_LAUNCH_ENV) == expected


def test_pass_seconds_are_recorded(caplog):
    with caplog.at_level(logging.INFO, logger="turbo_inductor"):
        run()
    (record,) = turbo_inductor.compile_records()
    manager = PassManager(PASSES, Options.parse(None, PASSES))
    pre_grad, post_grad = ({p.name for p in passes} for passes in (manager.passes, manager.post_grad_passes))
    # the POST_GRAD passes run on an FX graph cache miss only (on CPU the cache is on)
    assert pre_grad <= set(record.seconds) <= pre_grad | post_grad
    assert 0 < record.seconds["rmsnorm"] < 60
    assert f"replaced 1 rmsnorm in {record.seconds['rmsnorm']:.3f} s" in caplog.text


# torch 2.11 retraces a CPU graph under freezing without fake tensors: the passes try nothing and say so (manager.py).
@pytest.mark.pass_failures
def test_freezing_as_an_option_is_named_as_freezing_nothing():
    """Dynamo reads torch._inductor.config.freezing before the backend runs: the option alone would leave every
    parameter an input (and W's FP8 quantization at every call), so it warns; the global config does not."""
    with torch.no_grad(), pytest.warns(UserWarning, match=r"set torch._inductor.config.freezing = True"):
        run({"freezing": True})
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(freezing=True), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run({"freezing": True})
    assert not [w for w in seen if "freezes no parameter" in str(w.message)]


class SquareFunction(torch.autograd.Function):
    """A user's autograd.Function, as Liger-Kernel's kernels are: Dynamo traces it as a higher-order op."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class NormThenFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(32)

    def forward(self, x):
        return SquareFunction.apply(self.norm(x))


def test_a_higher_order_ops_body_without_fake_tensors_is_left_to_inductor_and_no_failure():
    """Inductor hands the passes each higher-order op's body too; torch 2.11 leaves their placeholders without fake
    tensors. Such a body is compiled by Inductor alone, and the graph around it is rewritten as ever."""

    def bodies_without_fakes(gm, example_inputs):
        for module in gm.modules():
            if module is not gm and isinstance(module, torch.fx.GraphModule):
                for node in module.graph.find_nodes(op="placeholder"):
                    node.meta.pop("example_value", None)
                    node.meta.pop("val", None)
        return backend.primus_turbo(gm, example_inputs)

    model, x = NormThenFunction(), torch.randn(4, 32)
    eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = model(eager_x)
    want.sum().backward()
    out = torch.compile(model, backend=bodies_without_fakes)(compiled_x)
    out.sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)
    (record,) = turbo_inductor.compile_records()
    assert record.failures == [] and record.counts["rmsnorm"] == 1


@pytest.mark.parametrize(
    "options, message",
    [
        ({"rmsnrom": True}, "unknown option 'rmsnrom'"),
        ({"rmsnorm": "maybe"}, "option 'rmsnorm' takes true/false"),
        ({"impl": "cutlass"}, "unknown implementation 'cutlass'"),
        ({"impl": {"grouped_gemm": "prefer:cutlass"}}, "unknown implementation 'prefer:cutlass' for grouped_gemm"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(Exception, match=message):
        run(options)


@pytest.mark.pass_failures
def test_failing_pass_falls_back_with_one_warning_unless_strict(monkeypatch):
    def broken(self, graph, options):
        for node in list(graph.nodes):  # damage the graph first: the fallback must undo it
            if node.op == "call_module" or node.op == "call_function":
                node.replace_all_uses_with(next(iter(graph.nodes)))
                break
        raise RuntimeError("boom")

    monkeypatch.setattr(RMSNormPass, "apply", broken)
    model = norm_model()
    x = torch.randn(4, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(model, backend="primus_turbo")(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    assert [str(w.message) for w in caught if "primus_turbo" in str(w.message)] == [
        "primus_turbo: pass rmsnorm failed and was skipped for this graph (RuntimeError('boom')); "
        "set options={'strict': True} to raise instead"
    ]
    assert turbo_inductor.compile_records()[-1].failures == [("rmsnorm", "RuntimeError('boom')")]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="boom"):
        torch.compile(model, backend="primus_turbo", options={"strict": True})(x)


@pytest.mark.pass_failures
def test_a_graph_without_fake_tensors_is_left_to_inductor_with_one_warning():
    """torch 2.11 retraces CPU graphs under Inductor's freezing before the pre-grad passes, without the fake tensors
    the matchers read: the pass manager says so and leaves the graph as it is."""
    gm = torch.fx.symbolic_trace(norm_model())  # a traced graph: no fake tensors in its nodes' meta
    before = gm.graph.python_code("self").src
    manager = PassManager(PASSES, Options.parse({}, PASSES))
    with pytest.warns(UserWarning, match="carries no fake tensors"):
        manager(gm.graph)
    assert gm.graph.python_code("self").src == before
    assert manager.record.failures == [("all", "the graph carries no fake tensors")] and not manager.record.counts


def test_nothing_to_fuse_compiles_as_inductor():
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    counts = assert_matches_inductor(model, [torch.randn(4, 32)])
    assert sum(counts.values()) == 0
    record = turbo_inductor.compile_records()[-1]
    assert record.ops_before == record.ops_after
    assert kernel_calls("rmsnorm_fwd") == 0


def test_cache_key_covers_options():
    def uuid(options):
        return PassManager(PASSES, Options.parse(options, PASSES)).uuid()

    assert uuid({}) == uuid({})
    assert uuid({}) != uuid({"rmsnorm": False})
    assert uuid({}) != uuid({"impl": "reference"})
    turbo_inductor.reset_records()


def test_graphs_before_and_after_are_recorded_on_request():
    run({"record_graphs": True})
    record = turbo_inductor.compile_records()[-1]
    assert "rms_norm" in record.graph_before and "turbo_inductor.rmsnorm" in record.graph_after
    assert "rms_norm" not in record.graph_after
