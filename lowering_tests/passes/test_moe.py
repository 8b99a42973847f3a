"""The MoE passes (moe_permute, moe_combine, grouped_mm, fp8_experts) on transformers' Mixtral and Qwen3-MoE blocks
and a torchtitan-style MoE: what is fused, forward and backward, results equal to backend="inductor", no recompile as
the routing changes, FP8 experts at their gates, near misses left alone and why."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch

import turbo_inductor
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import (
    assert_matches_inductor,
    assert_ran,
    declines,
    ops_after,
    rewrites_without_compiling,
    rewritten,
    run,
)
from turbo_inductor.testing.moe import TitanMoE, hf_sparse_moe
from turbo_inductor.testing.tolerance import snr_db

E = 4  # experts


def _hf(family: str, dtype: torch.dtype):
    torch.manual_seed(0)
    return hf_sparse_moe(family).to(DEVICE, dtype), [torch.randn(2, 8, 64, device=DEVICE, dtype=dtype)]


def _titan(dtype=torch.bfloat16, **kwargs):
    torch.manual_seed(0)
    model = TitanMoE(64, 32, experts=4, top_k=2, **kwargs).to(DEVICE, dtype)
    return model, [torch.randn(2, 8, 64, device=DEVICE, dtype=dtype)]


def _assert_fused(counts, grouped: int, glu: int) -> None:
    """Every routing op is ours: forward (permute, grouped GEMMs, GLU, combine) and backward (the combine's and
    the permute's gradients by dispatch and gather-sum, dx and dW of each grouped GEMM)."""
    assert counts["grouped_mm"] == grouped and counts["glu"] == glu
    assert counts["moe_permute"] == 1 and counts["moe_combine"] == 1
    assert len(turbo_inductor.compile_records()) == 1  # one graph: no graph break
    record = turbo_inductor.compile_records()[-1]
    assert ops_after("turbo_inductor.moe_permute") == 1 and ops_after("turbo_inductor.moe_combine") == 1
    left = [
        op for op in ("torch.sort", "torch.argsort", "torch.histc", "setitem", "scatter_add") if record.ops_after[op]
    ]
    assert not left and not record.ops_after["Tensor.scatter_add"], left
    assert_ran("moe_route", 1)
    assert_ran("moe_dispatch", 2)  # x_sorted; the combine's dy
    assert_ran("moe_gather_sum", 2)  # the combine; the permute's dx
    assert_ran("grouped_gemm", 2 * grouped)
    assert_ran("grouped_gemm_wgrad", grouped)


@pytest.mark.parametrize("family, dtype", [("mixtral", torch.bfloat16), ("qwen3_moe", torch.float32)])
def test_transformers_sparse_moe_block(family, dtype):
    """transformers' grouped_mm experts: torch._grouped_mm in bf16, their fallback op in fp32 under compile."""
    counts = assert_matches_inductor(*_hf(family, dtype))
    _assert_fused(counts, grouped=2, glu=1)


def test_torchtitan_moe_with_a_shared_expert():
    counts = assert_matches_inductor(*_titan())
    _assert_fused(counts, grouped=3, glu=2)  # the experts' and the shared expert's SwiGLU


def test_no_recompile_as_the_routing_or_the_length_changes():
    """Token counts per expert are data: steps with other routings run the one compiled graph, and with
    ``dynamic=True`` so does another sequence length (every size the passes compare is symbolic then)."""
    model, _ = _titan()
    compiled = torch.compile(model, backend="primus_turbo", dynamic=True)
    torch._dynamo.utils.counters.clear()
    routings = []
    for seq in (8, 8, 12):
        x = torch.randn(2, seq, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
        out = compiled(x)
        out.float().square().sum().backward()
        with torch.no_grad():
            torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)
            routings.append(torch.topk(model.router(x[:, :8].reshape(-1, 64)).float(), 2, dim=1).indices)
    assert not torch.equal(routings[0], routings[1]) and not torch.equal(routings[1], routings[2])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert len(turbo_inductor.compile_records()) == 1 and turbo_inductor.rewrite_counts()["moe_combine"] == 1


@pytest.mark.parametrize(
    "exclude, fused",
    [
        # the down projection, its input from the GLU
        (r"^(w1|w3|shared)", dict(fp8_experts=1, glu_fp8=1, moe_permute_fp8=0)),
        # the gate and up projections, their input from the permute in FP8
        (r"^(w2|shared)", dict(fp8_experts=2, glu_fp8=0, moe_permute_fp8=1)),
    ],
    ids=["down", "gate and up"],
)
def test_fp8_rowwise_experts_meet_the_gates(exclude, fused):
    """Each of a layer's expert GEMMs in FP8 rowwise, the rest of the layer in bf16: out and dx >= 25 dB, the
    experts' dW >= 20 dB against the layer in fp32 (its experts too; the router kept in fp32 in both, so that both
    route alike). With every GEMM of the layer in FP8 their noise adds up (about 24 dB on out and dx here): the gates
    hold for each GEMM, as the op tests check them one GEMM at a time."""
    model, _ = _titan()
    model.router.float()
    x = torch.randn(2, 16, 64, device=DEVICE, dtype=torch.bfloat16)
    impl = {"impl": "reference"} if DEVICE == "cpu" else {}  # the interpreter's fp8 stores round wrongly
    fp8 = {"recipe": "rowwise", "exclude": exclude, "experts": True}  # forced: a GPU's table measured no such layer
    outs, grads = run(model, [x], "primus_turbo", options={"fp8": fp8, **impl})
    counts = turbo_inductor.rewrite_counts()
    assert {name: counts[name] for name in fused} == fused and counts["fp8"] == 0
    truth, x32 = copy.deepcopy(model).float(), x.float().requires_grad_()
    truth.expert_dtype = torch.float32  # eagerly: torch._grouped_mm takes fp32 only outside a compile
    out32 = truth(x32)
    cotangent = torch.randn(out32.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)  # run()'s
    out32.backward(cotangent.to(DEVICE, torch.float32))
    assert snr_db(outs[0], out32) >= 25 and snr_db(grads[0], x32.grad) >= 25
    for (name, parameter), got in zip(truth.named_parameters(), grads[1:]):
        if name in ("w1", "w2", "w3"):
            assert snr_db(got, parameter.grad) >= 20, name


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_an_fp8_layer_meets_the_chained_gates_with_its_routing_held(recipe):
    """The whole layer in FP8, the router's linear aside (fp32, 4 experts): the experts' grouped GEMMs, the shared
    expert's linears, the GLUs writing their FP8 input, against the layer in fp32 routing alike. The router reads
    the layer's input in fp32 in both, and every token's k-th score leads its next by far more than fp32 rounding
    moves it: both pick the same experts."""
    model, _ = _titan()
    model.router.float()
    x = torch.randn(2, 8, 64, device=DEVICE, dtype=torch.bfloat16)
    impl = {"impl": "reference"} if DEVICE == "cpu" else {}  # the interpreter's fp8 stores round wrongly
    # experts forced into FP8: on a GPU, "auto" asks its cost table, which measured no layer this small
    outs, grads = run(model, [x], "primus_turbo", options={"fp8": {"recipe": recipe, "experts": True}, **impl})
    counts = turbo_inductor.rewrite_counts()
    assert counts["fp8_experts"] == 3
    # the permute moves FP8 rows for rowwise; the GLUs (experts', shared expert's) write the down GEMMs' FP8 input
    assert (counts["moe_permute_fp8"], counts["glu_fp8"]) == ((1, 2) if recipe == "rowwise" else (0, 0))
    assert ops_after("turbo_inductor.fp8_grouped_mm") == 3 and ops_after("turbo_inductor.grouped_mm") == 0
    assert ops_after("linear") == 1  # the router
    truth, x32 = copy.deepcopy(model).float(), x.float().requires_grad_()
    truth.expert_dtype = torch.float32  # eagerly: torch._grouped_mm takes fp32 only outside a compile
    out32 = truth(x32)
    cotangent = torch.randn(out32.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)  # run()'s
    out32.backward(cotangent.to(DEVICE, torch.float32))
    scores = truth.router(x32.detach().view(-1, 64)).softmax(-1).topk(3, dim=-1).values
    assert (scores[:, 1] - scores[:, 2]).min() > 1e-3
    # The gates are one FP8 GEMM's: 25 dB out, 20 dB gradients (e5m2's, rowwise's e4m3 ones held to it too). Every
    # result of a layer follows two GEMMs in series, whose noise powers add, so each gate is lowered by 10 log10(2) dB
    # as passes/test_fp8_linear.py chains its gates: the output follows gate/up then down; dx and gate/up's dW, down's
    # dgrad then theirs; down's dW reads gate/up's FP8 output; the router's, the experts' outputs. Measured: out 23.9 dB
    # rowwise, 23.5 tensorwise; the least gradient 20.0 (rowwise, the router's: the softmax's backward takes
    # differences) and 19.8 (tensorwise, shared.w1).
    chained = 10 * math.log10(2)
    assert snr_db(outs[0], out32) >= 25 - chained
    names = ["x"] + [name for name, _ in truth.named_parameters()]
    wants = [x32.grad] + [parameter.grad for parameter in truth.parameters()]
    for name, got, want in zip(names, grads, wants, strict=True):
        assert snr_db(got, want) >= 20 - chained, (name, snr_db(got, want))


@pytest.mark.parametrize("save", [True, False])
def test_the_experts_hold_their_fp8_w_t_only_where_the_option_saves_it(save):
    """The fp8 option's save_weight_t reaches the experts: False holds no FP8 copy of their weights from forward to
    backward (FSDP2's way, and the memory-first one), and their gradients are the same."""
    model, inputs = _titan()
    options = {"fp8": {"recipe": "rowwise", "save_weight_t": save, "experts": True}, "impl": "reference"}
    compiled = torch.compile(model, backend="primus_turbo", options=options)
    compiled(*inputs).float().sum().backward()  # compiles
    assert turbo_inductor.rewrite_counts()["fp8_experts"] == 3  # w1, w2, w3
    experts = {tuple(p.shape) for p in model.parameters() if p.dim() == 3}
    saved = []

    def pack(t):
        if t.dtype == torch.float8_e4m3fn and t.dim() == 3:
            saved.append(tuple(t.transpose(-2, -1).shape))
        return t

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = compiled(*inputs)
    out.float().sum().backward()
    assert (set(saved) == experts) if save else not saved, (saved, experts)


def test_the_experts_filter_leaves_experts_in_bf16():
    """In inference as well: the routing fused, the shared expert in FP8, the experts bf16 grouped GEMMs."""
    model, inputs = _titan()
    run(model, inputs, "primus_turbo", train=False, options={"fp8": {"recipe": "rowwise", "experts": False}})
    counts = turbo_inductor.rewrite_counts()
    assert counts["moe_permute"] == counts["moe_combine"] == 1
    # the shared expert in FP8: its gate and up as one linear over their concatenated weights, and its down
    assert (counts["fp8_experts"], counts["fp8"], counts["fp8_concat"]) == (0, 1, 1)
    assert ops_after("turbo_inductor.grouped_mm") == 3


class NearMiss(torch.nn.Module):
    """transformers' routing glue around one grouped GEMM, with one thing that the fused ops do not compute."""

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        if variant == "offsets in int64":
            from transformers.integrations import moe  # noqa: F401  (registers their fallback op)
        self.router = torch.nn.Linear(64, E, bias=False)
        self.w = torch.nn.Parameter(torch.randn(E, 32, 64) / 8)

    def forward(self, x, given_indices):
        probs = self.router(x).float().softmax(-1)
        weights, indices = torch.topk(probs, 2, dim=-1)
        if self.variant == "indices not from a top-k":
            indices = given_indices
        ids, perm = torch.sort(indices.reshape(-1))
        x_sorted = x[perm // 2]
        low = -1 if self.variant == "histogram from -1" else 0  # every id still counted, in the next bin
        offs = torch.cumsum(torch.histc(ids.float(), bins=E, min=low, max=E - 1), dim=0, dtype=torch.int32)
        if self.variant == "offsets in int64":
            y = torch.ops.transformers.grouped_mm_fallback(x_sorted, self.w.transpose(-2, -1), offs.long())
        else:
            y = torch._grouped_mm(x_sorted, self.w.transpose(-2, -1), offs=offs)
        weighted = y * weights.reshape(-1)[perm].unsqueeze(-1)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.shape[0], device=perm.device)
        total = weighted[inverse].view(-1, 2, 32).sum(1)
        if self.variant == "sum kept in fp32":
            return total
        if self.variant == "sorted ids read again":
            return total.to(x.dtype) + ids.float().mean().to(x.dtype)
        return total.to(x.dtype)


@pytest.mark.parametrize(
    "variant, fused, said",
    [
        ("indices not from a top-k", {}, "moe_permute left sort alone: the sorted ids are not"),
        ("histogram from -1", {}, "moe_permute left sort alone: no offsets"),
        (
            "offsets in int64",
            {"grouped_mm": 0, "moe_permute": 1, "moe_combine": 1},
            "grouped_mm left y alone: operands the op does not take",
        ),
        ("sum kept in fp32", {"moe_permute": 1, "grouped_mm": 1}, "the sum is used in torch.float32"),
        ("sorted ids read again", {"moe_permute": 1, "moe_combine": 1}, None),
    ],
)
def test_near_misses_are_left_alone_and_said_why(variant, fused, said, caplog):
    model = NearMiss(variant).to(DEVICE, torch.bfloat16)
    inputs = [torch.randn(10, 64, device=DEVICE, dtype=torch.bfloat16), torch.randint(0, E, (10, 2), device=DEVICE)]
    with caplog.at_level(logging.DEBUG, logger="turbo_inductor"):
        out, record = rewritten(model, inputs)
    fused = {"grouped_mm": 1, "moe_permute": 0, "moe_combine": 0} | fused
    assert {name: record.counts[name] for name in fused} == fused
    lines = declines(caplog, *fused)
    assert any(said in line for line in lines) if said is not None else lines == [], lines
    assert not record.ops_after["torch.sort"] or not fused["moe_permute"]  # a permute takes the sort's place
    with torch.no_grad():
        torch.testing.assert_close(out, model(*inputs), rtol=2e-2, atol=2e-2)


class WeightedGLU(torch.nn.Module):
    """Router weights on the experts' GLU output, as Primus-Turbo's MoE layers apply them; the rows then summed back
    unweighted."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(64, E, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(E, 64, 64) / 8)
        self.down = torch.nn.Parameter(torch.randn(E, 64, 32) / 6)

    def forward(self, x):
        weights, indices = torch.topk(self.router(x).float().softmax(-1), 2, dim=-1)
        ids, perm = torch.sort(indices.reshape(-1))
        offs = torch.cumsum(torch.histc(ids.float(), bins=E, min=0, max=E - 1), dim=0, dtype=torch.int32)
        h = torch._grouped_mm(x[perm // 2], self.gate_up.transpose(-2, -1), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up * weights.reshape(-1)[perm].unsqueeze(-1).to(x.dtype)
        y = torch._grouped_mm(h, self.down.transpose(-2, -1), offs=offs)
        return y[perm.argsort()].view(-1, 2, 64).sum(1)


def test_torchtitan_scores_before_the_experts():
    """torchtitan's default: the scores scale the experts' input (a multiply left to Inductor), and the combine sums
    the rows unweighted onto the shared expert's output."""
    model, (x,) = _titan(score_before_experts=True, score_func="sigmoid")
    out, record = rewritten(model, [x])
    assert record.counts["moe_permute"] == record.counts["moe_combine"] == 1 and record.ops_after["mul"] == 1
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)


def test_router_weights_on_the_glu_output_go_into_the_glu():
    """The GLU takes the permute's weights_sorted as its probs, and the combine sums the rows unweighted."""
    torch.manual_seed(0)
    model = WeightedGLU().to(DEVICE, torch.bfloat16)
    x = torch.randn(10, 64, device=DEVICE, dtype=torch.bfloat16)
    out, record = rewritten(model, [x])
    assert {name: record.counts[name] for name in ("moe_permute", "moe_combine", "glu")} == dict.fromkeys(
        ("moe_permute", "moe_combine", "glu"), 1
    )
    assert record.ops_after["mul"] == 0  # the weighting went into the GLU (the outputs below still agree)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)


def test_qwen3_moe_permutes_in_fp8_and_its_glu_writes_fp8_in_training():
    """Qwen3-MoE's block is Mixtral's routing and experts (the test below compiles Mixtral's): the same rewrites."""
    model, inputs = _hf("qwen3_moe", torch.bfloat16)
    counts = rewrites_without_compiling(model, inputs, options={"fp8": {"recipe": "rowwise", "experts": True}})
    assert (counts["fp8_experts"], counts["moe_permute_fp8"], counts["glu_fp8"], counts["moe_combine"]) == (2, 1, 1, 1)


def test_fp8_experts_take_the_permutes_fp8_rows_in_transformers_blocks():
    """Training transformers' sparse MoE block with FP8 rowwise experts: the permute moves x's FP8 rows and scales
    (no bf16 x_sorted: moe_dispatch runs once, for the combine's backward) and the GLU writes the down GEMM's FP8
    input; out and dx within the chained FP8 gates of backend="inductor"'s, the experts' and the router's gradients
    too (two GEMMs in series, as test_an_fp8_layer_meets_the_chained_gates_with_its_routing_held chains them)."""
    model, inputs = _hf("mixtral", torch.bfloat16)
    want_outs, want_grads = run(model, inputs, "inductor")
    impl = {"impl": "reference"} if DEVICE == "cpu" else {}  # the interpreter's fp8 stores round wrongly
    outs, grads = run(model, inputs, "primus_turbo", options={"fp8": {"recipe": "rowwise", "experts": True}, **impl})
    counts = turbo_inductor.rewrite_counts()
    assert (counts["fp8_experts"], counts["moe_permute_fp8"], counts["glu_fp8"], counts["moe_combine"]) == (2, 1, 1, 1)
    assert ops_after("turbo_inductor.moe_permute") == 0 and ops_after("turbo_inductor.moe_permute_fp8") == 1
    assert_ran("moe_dispatch_fp8", 1)
    assert_ran("moe_dispatch", 1)  # the combine's dy: no x_sorted in bf16
    assert_ran("moe_gather_sum", 2)  # the combine; dx, the gate/up GEMM's rows summed per token
    # Each wgrad moves one operand's FP8 bytes (gate/up: dy's, x being the permute's tokens; down: x's) and quantizes
    # the other's rows, the permute's read where they lie.
    assert_ran("fp8_transpose_grouped", 2)
    assert_ran("fp8_quantize_grouped", 2)
    chained = 10 * math.log10(2)
    assert snr_db(outs[0], want_outs[0]) >= 25 - chained
    for got, want in zip(grads, want_grads, strict=True):
        assert snr_db(got, want) >= 20 - chained


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_sentinel_masks_go_and_change_nothing(fp8):
    """The masks fill only rows past offs[-1], which our grouped GEMMs never read and write as zero in y and in x's
    gradient: both go, and outputs and gradients are those of the graph with them, bit for bit. In FP8 the permute
    then moves FP8 rows and the GLU writes the down GEMM's FP8 input."""
    torch.manual_seed(0)
    model = hf_sparse_moe("mixtral", expert_parallel_masks=True).to(DEVICE, torch.bfloat16)
    x = torch.randn(2, 12, 64, device=DEVICE, dtype=torch.bfloat16)
    options = {"fp8": {"recipe": "rowwise", "experts": True}} if fp8 else {}
    options |= {"impl": "reference"} if DEVICE == "cpu" else {}
    want_outs, want_grads = run(model, [x], "primus_turbo", options={**options, "moe_sentinel_mask": False})
    assert ops_after("Tensor.masked_fill_") == 1 and ops_after("Tensor.masked_fill") == 2
    turbo_inductor.reset_records()
    outs, grads = run(model, [x], "primus_turbo", options=options)
    counts = turbo_inductor.rewrite_counts()
    assert (counts["moe_sentinel_mask"], counts["moe_combine"], counts["glu"] + counts["glu_fp8"]) == (1, 1, 1)
    assert (counts["fp8_experts"], counts["moe_permute_fp8"], counts["glu_fp8"]) == ((2, 1, 1) if fp8 else (0, 0, 0))
    assert ops_after("Tensor.masked_fill_") == 0 and ops_after("Tensor.masked_fill") == 0
    for got, want in zip(outs + grads, want_outs + want_grads, strict=True):
        assert torch.equal(got, want)
    if not fp8:
        assert assert_matches_inductor(model, [x], options=options)["moe_sentinel_mask"] == 1
