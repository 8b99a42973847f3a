"""The mm_fp32_output pass: a bf16 mm whose one use is its cast to fp32 becomes one mm writing fp32, on AOTAutograd's
graphs (each fp32 parameter's gradient under autocast). Matched on graphs of fake CUDA tensors on any machine; run
on the GPU, where cuBLAS writes fp32."""

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

import turbo_inductor
from turbo_inductor.options import Options
from turbo_inductor.passes import PASSES, PassManager
from turbo_inductor.passes.mm_fp32_output import MMFP32OutputPass
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import run
from turbo_inductor.testing.tolerance import snr_db

aten, prims = torch.ops.aten, torch.ops.prims
pytestmark = pytest.mark.skipif(not hasattr(aten.mm, "dtype"), reason="torch < 2.9 has no mm with an output dtype")


def graph_of(dtype=torch.bfloat16, device="cuda", cast_to=torch.float32, mm_used_twice=False, view=False) -> fx.Graph:
    """``convert_element_type(mm(a, b), cast_to)`` as AOTAutograd's backward spells dW, on fake tensors; with ``view``,
    ``convert_element_type(reshape(mm(a, b), (2, 8, 4)), cast_to)`` as it spells a 3-D input's gradient."""
    graph = fx.Graph()
    with FakeTensorMode():
        a, b = torch.randn(16, 8, dtype=dtype, device=device), torch.randn(8, 4, dtype=dtype, device=device)
        values = {"a": a, "b": b, "mm": a @ b}
        values["view"] = values["mm"].view(2, 8, 4)
        values["cast"] = values["view" if view else "mm"].to(cast_to)
    nodes = {name: graph.placeholder(name) for name in ("a", "b")}
    nodes["mm"] = graph.call_function(aten.mm.default, (nodes["a"], nodes["b"]))
    if view:
        nodes["view"] = graph.call_function(aten.reshape.default, (nodes["mm"], [2, 8, 4]))
    nodes["cast"] = graph.call_function(prims.convert_element_type.default, (nodes["view" if view else "mm"], cast_to))
    for name, node in nodes.items():
        node.meta["val"] = values[name]
    graph.output((nodes["cast"], nodes["mm"]) if mm_used_twice else (nodes["cast"],))
    return graph


def rewritten(graph: fx.Graph) -> int:
    return MMFP32OutputPass().apply(graph, Options.parse({}, PASSES))


def test_a_bf16_mm_cast_to_fp32_becomes_one_mm_writing_fp32():
    graph = graph_of()
    assert rewritten(graph) == 1
    (mm,) = [n for n in graph.nodes if n.op == "call_function"]
    assert mm.target is aten.mm.dtype and mm.args[2] == torch.float32
    assert mm.meta["val"].dtype == torch.float32 and mm.meta["val"].shape == (16, 4)
    graph.lint()


def test_a_view_between_stays_a_view_of_the_fp32_product():
    graph = graph_of(view=True)
    assert rewritten(graph) == 1
    mm, view = [n for n in graph.nodes if n.op == "call_function"]
    assert mm.target is aten.mm.dtype and mm.meta["val"].dtype == torch.float32 and mm.meta["val"].shape == (16, 4)
    assert view.target is aten.reshape.default and view.args[0] is mm
    assert view.meta["val"].dtype == torch.float32 and view.meta["val"].shape == (2, 8, 4)
    graph.lint()


@pytest.mark.parametrize(
    "graph",
    [
        graph_of(mm_used_twice=True),  # the bf16 product is read too: it stays
        graph_of(mm_used_twice=True, view=True),
        graph_of(dtype=torch.float32),  # nothing to widen
        graph_of(cast_to=torch.float16),
        graph_of(device="cpu"),  # cuBLAS's mm.dtype only
    ],
    ids=["mm-read-elsewhere", "mm-read-elsewhere-through-view", "fp32-mm", "cast-to-fp16", "cpu"],
)
def test_other_casts_and_mms_stay(graph):
    before = [(n.op, n.target) for n in graph.nodes]
    assert rewritten(graph) == 0
    assert [(n.op, n.target) for n in graph.nodes] == before


def test_under_autocast_each_weight_gradient_is_written_in_fp32():
    """fp32 parameters under bf16 autocast: each weight's gradient (and the fp32 input's), a bf16 mm cast to fp32 in
    the backward graph, is one mm writing fp32 on the GPU (on CPU the pass leaves it: no rewrite). The gradients are
    Inductor's up to its rounding to bf16, and no farther from the fp32 model's than Inductor's are."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32, bias=False)).to(DEVICE)
    x = torch.randn(4, 16, 64, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        turbo_inductor.reset_records()
        (out,), grads = run(model, [x], "primus_turbo")
        counts = turbo_inductor.rewrite_counts()
        (want,), want_grads = run(model, [x], "inductor")
    _, exact = run(model, [x], "eager")  # fp32
    # the two weights' gradients and x's (fp32): the second linear's dx feeds ReLU's backward in bf16
    assert counts["mm_fp32_output"] == (3 if DEVICE == "cuda" else 0)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for got, expected, truth in zip(grads, want_grads, exact):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=2**-7, atol=0)
        assert snr_db(got, truth) >= snr_db(expected, truth) - 0.1


def test_the_option_turns_it_off():
    assert not any(p.name == "mm_fp32_output" for p in _post_grad_passes({"mm_fp32_output": False}))
    assert any(p.name == "mm_fp32_output" for p in _post_grad_passes({}))


def _post_grad_passes(options: dict) -> list:
    return PassManager(PASSES, Options.parse(options, PASSES)).post_grad_passes
