"""The pass pipeline: phases and declared order checked at import, claims, and passes that read our op nodes by name.
Graph-level: the passes run on the graphs Dynamo captures, nothing is compiled."""

import functools

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F

from turbo_inductor import costs
from turbo_inductor.ops.fp8_linear import FP8LinearNode
from turbo_inductor.ops.node import OpNode, view_of
from turbo_inductor.options import Options
from turbo_inductor.passes import PASSES, PassManager, PassOrderError, Phase, RewritePass, check_order, claims
from turbo_inductor.passes.linears import linear_of
from turbo_inductor.testing.distributed import SumOverRanks
from turbo_inductor.testing.grouped_mm import HOST_READING, register_host_reading
from turbo_inductor.testing.llama import LlamaConfig, LlamaDecoder
from turbo_inductor.testing.moe import TitanMoE, hf_sparse_moe
from turbo_inductor.testing.rotary import Attention


def dynamo_graph(model, *inputs) -> torch.fx.GraphModule:
    """The one graph Dynamo captures of ``model(*inputs)``, with its example values; nothing is compiled."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture, fullgraph=True)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def rewrite(gm: torch.fx.GraphModule, options: dict):
    """Runs every pass on ``gm`` in strict mode; returns its record (counts, ops after)."""
    manager = PassManager(PASSES, Options.parse({**options, "strict": True}, PASSES))
    manager(gm.graph)
    return manager.record


# ---- phases and order -----------------------------------------------------------------------------------------


def a_pass(name: str, phase: Phase, after: tuple[str, ...] = ()) -> RewritePass:
    return type(name, (RewritePass,), {"name": name, "phase": phase, "after": after})()


def test_the_pass_list_keeps_its_phases_and_declared_order():
    assert check_order(PASSES) is PASSES
    assert [p.phase for p in PASSES] == sorted(p.phase for p in PASSES)
    for i, rewrite_pass in enumerate(PASSES):
        assert all(name in [p.name for p in PASSES[:i]] for name in rewrite_pass.after)


@pytest.mark.parametrize(
    "passes, message",
    [
        ([a_pass("norm", Phase.FUSE), a_pass("linear", Phase.CLAIM)], "'linear' .* listed after pass 'norm'"),
        (
            [a_pass("producer", Phase.PRODUCERS, after=("norm",)), a_pass("norm", Phase.PRODUCERS)],
            "'producer' must run after pass 'norm', which is listed later",
        ),
        ([a_pass("residual", Phase.FUSE, after=("nowhere",))], "'residual' runs after 'nowhere', which is not a pass"),
    ],
    ids=["phase", "after", "unknown"],
)
def test_a_broken_order_is_an_error_naming_both_passes(passes, message):
    with pytest.raises(PassOrderError, match=message):
        check_order(passes)


def test_claims_give_a_linear_to_the_highest_priority_that_wants_it(monkeypatch):
    monkeypatch.setattr(claims, "_CLAIMANTS", {})
    claims.claimant("low", 1)(lambda linear, options: True)
    claims.claimant("high", 2)(lambda linear, options: options == "wants high")
    assert claims.owner(None, "wants high") == "high"
    assert claims.owner(None, "other") == "low"
    monkeypatch.setattr(claims, "_CLAIMANTS", {})
    assert claims.owner(None, "other") is None


# ---- named views of our ops' nodes ------------------------------------------------------------------------------


def views() -> list[type[OpNode]]:
    found, todo = [], [OpNode]
    while todo:
        for view in todo.pop().__subclasses__():
            found.append(view)
            todo.append(view)
    return found


def test_every_view_names_arguments_of_its_op_and_builds_calls_by_name():
    assert len(views()) >= 13
    view = FP8LinearNode
    args, kwargs = view.call_arguments(x="x", weight="w", bias=None, recipe="rowwise", impl="auto")
    assert (args, kwargs) == (("x", "w", None, "rowwise"), {})
    args, _ = view.call_arguments(x="x", weight="w", bias=None, recipe="rowwise", impl="auto", save_weight_t=False)
    assert args == ("x", "w", None, "rowwise", "auto", None, None, False)
    with pytest.raises(TypeError, match="'recipe' .* is required"):
        view.call_arguments(x="x", weight="w")
    with pytest.raises(TypeError, match=r"\['scale'\] are not arguments"):
        view.call_arguments(x="x", weight="w", recipe="rowwise", scale=1)
    with pytest.raises(TypeError, match=r"\['scale'\] are not arguments"):
        type("Bad", (OpNode,), {"op": view.op, "__annotations__": {"scale": "int"}})
    graph = torch.fx.Graph()
    node = graph.call_function(view.op, (graph.placeholder("x"), graph.placeholder("w"), None, "rowwise"))
    assert type(view_of(node)) is view, "a rejected view leaves the op's own in place"


class Decoder(nn.Module):
    """The tiny Llama-style decoder (fused gate/up: glu_fused) and a separate-projection SwiGLU (glu), between a
    token embedding and an LM head with its loss."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.decoder = LlamaDecoder(LlamaConfig(hidden=64, intermediate=96, heads=4, kv_heads=2, layers=2))
        self.gate, self.up = nn.Linear(64, 96, bias=False), nn.Linear(64, 96, bias=False)
        self.down = nn.Linear(96, 64, bias=False)
        self.head = nn.Linear(64, 100, bias=False)

    def forward(self, ids, labels):
        h = self.decoder(self.embed(ids))
        logits = self.head(h + self.down(F.silu(self.gate(h)) * self.up(h)))
        return F.cross_entropy(logits.float().view(-1, 100), labels.view(-1))


class AutocastDecoder(Decoder):
    """The decoder in fp32 under a bf16 autocast region of its own (the graph enters it): bf16 linears."""

    def forward(self, ids, labels):
        with torch.autocast(ids.device.type, torch.bfloat16):
            return super().forward(ids, labels)


class TensorParallel(nn.Module):
    def __init__(self):
        super().__init__()
        self.column, self.row = nn.Linear(64, 48), nn.Linear(48, 64, bias=False)

    def forward(self, x):
        h = torch.relu(self.column(SumOverRanks.apply(x)))
        return funcol.all_reduce(self.row(h), "sum", dist.group.WORLD)


def graphs() -> dict:
    """(capture, options) of graphs on which every pass fires: FP8 where it takes no linear the others want."""
    moe = TitanMoE(64, 32, experts=4, top_k=2, expert_dtype=torch.bfloat16).to(torch.bfloat16)
    hf_moe = hf_sparse_moe("mixtral", expert_parallel_masks=True).to(torch.bfloat16)
    fp8 = {"fp8": "rowwise"}

    def decoder_inputs():
        return torch.randint(0, 100, (2, 8)), torch.randint(0, 100, (2, 8))

    def decoder():
        return dynamo_graph(Decoder(), *decoder_inputs())

    return {
        "decoder": (decoder, fp8),
        "decoder tensorwise": (decoder, {"fp8": "tensorwise"}),  # separate q/k/v and gate/up share x
        "decoder under autocast": (lambda: dynamo_graph(AutocastDecoder(), *decoder_inputs()), {}),
        "tensor parallel": (lambda: dynamo_graph(TensorParallel(), torch.randn(4, 64, requires_grad=True)), {}),
        "moe": (lambda: dynamo_graph(moe, torch.randn(2, 8, 64, dtype=torch.bfloat16)), fp8),
        # transformers' experts with the sentinel masks of expert parallelism (moe_sentinel_mask)
        "hf moe": (lambda: dynamo_graph(hf_moe, torch.randn(2, 8, 64, dtype=torch.bfloat16)), {}),
        "attention": (lambda: dynamo_graph(Attention(), torch.randn(2, 6, 48, dtype=torch.bfloat16)), {}),
    }


_LIBRARY = torch.library.Library("turbo_inductor_schema_test", "DEF")


@functools.cache
def with_an_extra_argument(original: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """A copy of ``original`` whose schema ends in one more optional argument, running the original op."""
    schema = original._schema
    name = schema.name.split("::")[1]
    head, returns = str(schema).split(") -> ", 1)
    _LIBRARY.define(f"{name}({head.split('(', 1)[1]}, int unused_extra=0) -> {returns}")
    count = len(schema.arguments)

    def run(*args, unused_extra=0, **kwargs):
        return original(*args[:count], **kwargs)

    _LIBRARY.impl(name, run, "CompositeImplicitAutograd")
    return getattr(torch.ops.turbo_inductor_schema_test, name).default


def test_an_optional_argument_appended_to_every_op_changes_no_rewrite(fake_group, monkeypatch):
    # grouped_mm_impl rewrites where a cost table measured another implementation faster: here, everywhere, to one
    # reading offs on the host (grouped_mm_host_offs)
    register_host_reading(monkeypatch)
    monkeypatch.setattr(costs, "grouped_implementation", lambda *shape: (HOST_READING, "preferred by the test"))
    before = {name: rewrite(capture(), options) for name, (capture, options) in graphs().items()}
    for view in views():
        monkeypatch.setattr(view, "op", with_an_extra_argument(view.op))
    # The nodes the passes make carry the new argument (not at its default), so reading by position would see it.
    call_arguments = OpNode.call_arguments.__func__
    monkeypatch.setattr(
        OpNode, "call_arguments", classmethod(lambda v, **a: call_arguments(v, **{"unused_extra": 1, **a}))
    )
    after = {name: rewrite(capture(), options) for name, (capture, options) in graphs().items()}
    fired = {name for record in before.values() for name, count in record.replaced.items() if count}
    # every pass but the hand-written and torchao FP8 spellings, which their own tests cover, and causal_mask and
    # mm_fp32_output (post-grad), which make none of our ops
    unfired = {"fp8_scaled_mm", "torchao_float8", "causal_mask", "mm_fp32_output"}
    assert fired == {p.name for p in PASSES} - unfired
    for name in before:
        assert after[name].counts == before[name].counts, name
        renamed = {
            op.replace("turbo_inductor_schema_test.", "turbo_inductor."): n for op, n in after[name].ops_after.items()
        }
        assert renamed == dict(before[name].ops_after), name
        assert any(op.startswith("turbo_inductor_schema_test.") for op in after[name].ops_after), name


# A linear's spellings, each a function of (x [rows, 32], W [48, 32], b [48]).
SPELLINGS = {
    "F.linear": lambda x, w, b: F.linear(x, w, b),
    "x @ W.t()": lambda x, w, b: x @ w.t(),
    "x @ W.T": lambda x, w, b: x @ w.T,
    "matmul transpose": lambda x, w, b: torch.matmul(x, w.transpose(0, 1)),
    "x @ V": lambda x, w, b: x @ w.t().contiguous(),
    "torch.mm": lambda x, w, b: torch.mm(x, w.t()),
    "addmm": lambda x, w, b: torch.addmm(b, x, w.t()),
}


class Spelled(nn.Module):
    """One spelling of a linear, as written in FP8, row-parallel or column-parallel code."""

    def __init__(self, spelling: str, form: str):
        super().__init__()
        self.spelling, self.form = SPELLINGS[spelling], form
        self.w, self.b = nn.Parameter(torch.randn(48, 32)), nn.Parameter(torch.randn(48))

    def forward(self, x):
        if self.form == "gemm_allreduce_dgrad":
            x = SumOverRanks.apply(x)
        y = self.spelling(x, self.w, self.b)
        return funcol.all_reduce(y, "sum", dist.group.WORLD) if self.form == "gemm_allreduce" else y


@pytest.mark.parametrize("rewrite_pass", ["fp8", "gemm_allreduce", "gemm_allreduce_dgrad"])
@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_pass_that_replaces_linears_takes_every_spelling(fake_group, spelling, rewrite_pass):
    gm = dynamo_graph(Spelled(spelling, rewrite_pass), torch.randn(16, 32, requires_grad=True))
    counts = rewrite(gm, {"fp8": "rowwise"} if rewrite_pass == "fp8" else {}).counts
    assert counts[rewrite_pass] == 1


def test_linear_of_reads_weight_and_bias_of_every_spelling():
    spelled = nn.ModuleList(Spelled(name, "fp8") for name in SPELLINGS)
    gm = dynamo_graph(lambda x: [linear(x) for linear in spelled], torch.randn(16, 32))
    linears = [found for found in map(linear_of, gm.graph.nodes) if found is not None]
    assert [found.weight_transposed for found in linears] == [name == "x @ V" for name in SPELLINGS]
    assert [found.bias is not None for found in linears] == [name in ("F.linear", "addmm") for name in SPELLINGS]


class Breaking(RewritePass):
    """Leaves a node that reads a later one (a graph no longer in order), then raises."""

    name, phase = "breaking", Phase.FUSE

    def apply(self, graph, options):
        calls = [n for n in graph.nodes if n.op == "call_function"]
        with graph.inserting_before(calls[0]):
            graph.call_function(torch.neg, (calls[-1],))
        raise RuntimeError("broken on purpose")


@pytest.mark.pass_failures
def test_a_pass_that_breaks_the_graph_and_raises_leaves_the_graph_as_it_was():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    x = torch.randn(2, 8)
    gm = dynamo_graph(model, x)
    ops = [(n.op, n.target) for n in gm.graph.nodes]
    manager = PassManager([Breaking()], Options.parse({}, [Breaking()]))
    with pytest.warns(UserWarning, match="pass breaking failed"):
        manager(gm.graph)
    gm.recompile()
    gm.graph.lint()
    assert [(n.op, n.target) for n in gm.graph.nodes] == ops and manager.record.failures[0][0] == "breaking"


def test_left_alone_fails_where_a_pass_rewrites_or_raises(monkeypatch):
    """compare.assert_left_alone, which the near-miss tests use in place of compiling, can fail: on a model with a
    site to fuse, and on a near miss whose pass raises (strict)."""
    from turbo_inductor.testing.compare import assert_left_alone

    with pytest.raises(AssertionError, match="rmsnorm"):
        assert_left_alone(nn.RMSNorm(8), [torch.randn(2, 8)])
    rmsnorm_pass = next(p for p in PASSES if p.name == "rmsnorm")
    monkeypatch.setattr(type(rmsnorm_pass), "apply", Breaking.apply)
    with pytest.raises(RuntimeError, match="broken on purpose"):
        assert_left_alone(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), [torch.randn(2, 8)])
