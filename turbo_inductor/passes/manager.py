"""The pass manager: runs the enabled rewrite passes on a Dynamo graph and records what they did.

Inductor calls it as ``pre_grad_custom_pass``, before AOTAutograd (``docs/passes.md`` says why).
A pass that raises is undone and named in a warning; with ``strict`` it raises.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import enum
import functools
import hashlib
import logging
import pathlib
import time
import warnings
from typing import Any

import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from .. import environment
from ..kernels import registry
from ..ops.node import view_of
from ..options import Options, parse_bool
from . import ir, surgery

log = logging.getLogger("turbo_inductor")
PACKAGE = pathlib.Path(__file__).resolve().parent.parent


class Phase(enum.IntEnum):
    """The pipeline's phases, in the order they run."""

    CANONICALIZE = 1  # one spelling per operation for the passes after
    CLAIM = 2  # linears replaced by the passes that take them whole (FP8, GEMM + all-reduce)
    FUSE = 3  # norms, GLUs and MoE glue onto our ops
    PRODUCERS = 4  # producers of FP8 linears' inputs write them in FP8
    POST_GRAD = 5  # on AOTAutograd's forward and backward graphs (aten IR), as Inductor's post-grad passes


class RewritePass:
    """One fusion. Subclasses set ``name`` (the option key), ``phase`` and ``after``, and implement ``apply``.
    ``after`` names the passes whose output this one reads.
    The option is on/off, default on, unless ``parse_option`` says otherwise."""

    name: str = ""
    phase: Phase
    after: tuple[str, ...] = ()
    default: Any = True

    def parse_option(self, value: Any) -> Any:
        return parse_bool(self.name, value)

    def enabled(self, value: Any) -> bool:
        return bool(value)

    def apply(self, graph: fx.Graph, options: Options) -> int:
        """Rewrite every match in ``graph``; return how many were rewritten."""
        raise NotImplementedError


def declined(pass_name: str, node: fx.Node, reason: str) -> None:
    """Log at DEBUG why pass ``pass_name`` left the site at ``node`` alone: one line per near miss."""
    log.debug("primus_turbo: %s left %s alone: %s", pass_name, node.name, reason)


_COMPILING: contextvars.ContextVar[CompileRecord | None] = contextvars.ContextVar("turbo_inductor_record", default=None)


def decided(pass_name: str, what: str, reason: str) -> None:
    """A choice the user should see (FP8 or not, by the cost model): logged at INFO and kept in the record of the
    graph being rewritten, once per ``what`` and reason (a reason names the shape it is about)."""
    line = f"{pass_name}: {what}: {reason}"
    record = _COMPILING.get()
    if record is not None and line in record.decisions:
        return
    if record is not None:
        record.decisions.append(line)
    log.info("primus_turbo: %s", line)


class PassOrderError(ValueError):
    """The pass list breaks a pass's declared phase or ``after``."""


def check_order(passes: list[RewritePass]) -> list[RewritePass]:
    """``passes``, if each runs in its phase's turn and after the passes it names.
    Otherwise PassOrderError, naming both passes."""
    position = {p.name: i for i, p in enumerate(passes)}
    for i, rewrite in enumerate(passes):
        if not isinstance(getattr(rewrite, "phase", None), Phase):
            raise PassOrderError(f"pass {rewrite.name!r} declares no phase")
        earlier = next((p for p in passes[:i] if p.phase > rewrite.phase), None)
        if earlier is not None:
            raise PassOrderError(
                f"pass {rewrite.name!r} (phase {rewrite.phase.name}) is listed after pass {earlier.name!r} "
                f"(phase {earlier.phase.name})"
            )
        for name in rewrite.after:
            if name not in position:
                raise PassOrderError(f"pass {rewrite.name!r} runs after {name!r}, which is not a pass")
            if position[name] > i:
                raise PassOrderError(f"pass {rewrite.name!r} must run after pass {name!r}, which is listed later")
    return passes


def phase_table(passes: list[RewritePass]) -> str:
    """The passes by phase as a Markdown table (docs/architecture.md shows it)."""
    rows = ["| phase | pass | runs after | what it does |", "|---|---|---|---|"]
    for rewrite in passes:
        summary = (type(rewrite).__doc__ or "").strip().splitlines()[0].replace("``", "`")
        after = ", ".join(f"`{name}`" for name in rewrite.after)
        rows.append(f"| {rewrite.phase.name.lower()} | `{rewrite.name}` | {after} | {summary} |")
    return "\n".join(rows)


@dataclasses.dataclass
class CompileRecord:
    """What the passes did to one compiled graph (and its subgraphs).
    ``counts``: fused sites per pass in the graph as compiled (see :func:`rewrite_counts`). ``replaced``: what
    each pass replaced, a site a later pass rewrote again counted for both.
    ``implementations``: per kernel of our ops in the graph, the implementations it uses, in the order tried.
    It is filled when the graph is loaded from the cache too. ``seconds``: wall time per pass. ``decisions``: the
    choices passes made by the cost model (FP8 or high precision per GEMM) and why."""

    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    replaced: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    implementations: dict = dataclasses.field(default_factory=dict)
    ops_before: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    ops_after: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    graph_before: str = ""  # filled with option record_graphs
    graph_after: str = ""
    failures: list = dataclasses.field(default_factory=list)  # (pass name, error text)
    seconds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    decisions: list = dataclasses.field(default_factory=list)


_RECORDS: collections.deque = collections.deque(maxlen=64)


def compile_records() -> list[CompileRecord]:
    """A record per graph compiled with backend="primus_turbo" since :func:`reset_records`, the last 64."""
    return list(_RECORDS)


def rewrite_counts() -> dict[str, int]:
    """Fused sites per pass in the graphs as compiled, summed over :func:`compile_records`.
    A site a later pass rewrote again counts for the later pass alone: three norms, two of them fused with their
    residual add, count ``{"rmsnorm": 1, "rmsnorm_residual": 2}``."""
    total = collections.Counter()
    for record in _RECORDS:
        total.update(record.counts)
    return dict(total)


def reset_records() -> None:
    _RECORDS.clear()


def forget(record: CompileRecord) -> None:
    """Drop the record of a compile that did not finish."""
    if record in _RECORDS:
        _RECORDS.remove(record)


@functools.cache
def _source_hash(package: pathlib.Path = PACKAGE) -> str:
    """Hash of the package's sources and data, part of the cache key.
    The passes and ops (their schemas and fakes) shape the rewritten graph, and so do the FP8 cost tables; on GPU
    the kernels are traced into it."""
    digest = hashlib.sha256()
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.json")]):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _snapshot(graph: fx.Graph) -> tuple[fx.Graph, dict]:
    """A copy of ``graph``, and its placeholders mapped back to the originals.
    A restore keeps the original placeholders: Dynamo and AOTAutograd keep state on them."""
    copy = fx.Graph(owning_module=graph.owning_module)
    to_copy: dict = {}
    copy.output(copy.graph_copy(graph, to_copy))
    return copy, {to_copy[n]: n for n in graph.nodes if n.op == "placeholder"}


def _restore(graph: fx.Graph, snapshot: tuple[fx.Graph, dict]) -> None:
    copy, env = snapshot
    env = dict(env)
    doomed = [node for node in graph.nodes if node.op != "placeholder"]
    for node in doomed:  # a failed pass may leave a use before its definition: unlink everything first
        node.args, node.kwargs = (), {}
    for node in reversed(doomed):
        graph.erase_node(node)
    for node in copy.nodes:
        if node.op == "output":
            graph.output(fx.map_arg(node.args[0], env.__getitem__))
        elif node.op != "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)


# GraphModule.meta key marking the bodies of higher-order ops (autograd.Function, checkpoint) in Dynamo's graph.
HOP_BODY = "primus_turbo_hop_body"


def mark_hop_bodies(gm: fx.GraphModule) -> None:
    """Marks the graphs of ``gm``'s higher-order ops. Inductor hands each to the passes too; torch 2.11 leaves their
    placeholders without fake tensors (Liger-Kernel's autograd.Functions), which is then no failure of ours."""
    for module in gm.modules():
        if module is not gm and isinstance(module, fx.GraphModule):
            module.meta[HOP_BODY] = True


class PassManager(CustomGraphPass):
    """The passes before POST_GRAD on Dynamo's graph (Inductor's pre-grad custom pass); :attr:`post_grad` runs the
    POST_GRAD ones. Both count into one record."""

    def __init__(self, passes: list[RewritePass], options: Options):
        enabled = [p for p in passes if p.enabled(options.value(p.name))]
        self.passes = [p for p in enabled if p.phase < Phase.POST_GRAD]
        self.post_grad_passes = [p for p in enabled if p.phase == Phase.POST_GRAD]
        self.options = options
        self.record = CompileRecord()
        _RECORDS.append(self.record)

    @property
    def post_grad(self) -> PostGradPasses | None:
        """Inductor's post-grad custom pass running the POST_GRAD passes, or None where none is enabled."""
        return PostGradPasses(self) if self.post_grad_passes else None

    def __call__(self, graph: fx.Graph) -> None:
        record = self.record
        record.ops_before.update(ir.op_name(n) for n in graph.nodes)
        if self.options.record_graphs:
            record.graph_before += graph.python_code("self").src
        if any(n.op == "placeholder" and not ({"example_value", "val"} & n.meta.keys()) for n in graph.nodes):
            # The matchers read shapes and dtypes from Dynamo's fake tensors. torch 2.11 retraces CPU graphs
            # under freezing without them, so nothing could match.
            if getattr(graph.owning_module, "meta", {}).get(HOP_BODY):
                log.debug("primus_turbo: a higher-order op's body carries no fake tensors: Inductor compiles it alone")
                return
            record.failures.append(("all", "the graph carries no fake tensors"))
            warnings.warn(
                "primus_turbo: the graph Inductor handed to the passes carries no fake tensors (torch 2.11 "
                "retraces CPU graphs under freezing): no rewrite was tried, Inductor compiles it alone",
                stacklevel=2,
            )
            record.ops_after.update(record.ops_before)
            return
        token = _COMPILING.set(record)
        try:
            self.run_passes(graph, self.passes)
        finally:
            _COMPILING.reset(token)
        # Counted from 0 here: Inductor runs the POST_GRAD passes on a cache miss only.
        record.counts.update(dict.fromkeys((p.name for p in self.post_grad_passes), 0))
        record.ops_after.update(ir.op_name(n) for n in graph.nodes)
        _record_implementations(record, graph)
        if self.options.record_graphs:
            record.graph_after += graph.python_code("self").src
        if log.isEnabledFor(logging.DEBUG):
            log.debug("primus_turbo: graph after passes:\n%s", graph.python_code("self").src)

    def run_passes(self, graph: fx.Graph, passes: list[RewritePass]) -> None:
        record = self.record
        for rewrite in passes:
            start = time.perf_counter()
            snapshot = _snapshot(graph)
            before = set(graph.nodes)
            try:
                count = rewrite.apply(graph, self.options)
                graph.lint()
            except Exception as error:  # a rewrite must never break a compile
                if self.options.strict:
                    raise
                _restore(graph, snapshot)
                record.seconds[rewrite.name] += time.perf_counter() - start
                record.failures.append((rewrite.name, repr(error)))
                warnings.warn(
                    f"primus_turbo: pass {rewrite.name} failed and was skipped for this graph "
                    f"({error!r}); set options={{'strict': True}} to raise instead",
                    stacklevel=2,
                )
                continue
            record.counts[rewrite.name] += count
            record.replaced[rewrite.name] += count
            _count_sites(record, graph, before, rewrite.name)
            record.seconds[rewrite.name] += time.perf_counter() - start
            log.info("primus_turbo: replaced %d %s in %.3f s", count, rewrite.name, record.seconds[rewrite.name])

    def __getstate__(self) -> dict:
        # torch 2.11 pickles the Inductor config, this manager included, into its cache keys. The record (counts,
        # timings) is what a compile did, not what the passes do: pickled, it would make every key new.
        return {"passes": self.passes, "post_grad_passes": self.post_grad_passes, "options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.record = CompileRecord()

    def uuid(self) -> str:
        """The cache tag: the sources, the options, the rank layout, and what decides the kernels compiled code
        calls (versions, device, native build, implementations: ``environment.identity``)."""
        return hashlib.sha256(
            (_source_hash() + self.options.fingerprint() + _distributed_identity() + environment.identity()).encode()
        ).hexdigest()


class PostGradPasses(CustomGraphPass):
    """A manager's POST_GRAD passes, as Inductor's ``post_grad_custom_post_pass``: they run on a cache miss only."""

    def __init__(self, manager: PassManager):
        self.manager = manager

    def __call__(self, graph: fx.Graph) -> None:
        self.manager.run_passes(graph, self.manager.post_grad_passes)

    def uuid(self) -> str:
        return self.manager.uuid()


def _count_sites(record: CompileRecord, graph: fx.Graph, before: set, name: str) -> None:
    """Marks the ops pass ``name`` just made as its sites. A site of an earlier pass that it replaced leaves that
    pass's count: it is one site, counted for the pass whose op the graph keeps."""
    after = set(graph.nodes)
    for node in before - after:
        if surgery.SITE in node.meta:
            record.counts[node.meta[surgery.SITE]] -= 1
    for node in after - before:
        if surgery.SITE in node.meta and node.meta[surgery.SITE] is None:
            node.meta[surgery.SITE] = name


def _record_implementations(record: CompileRecord, graph: fx.Graph) -> None:
    """For each kernel our ops in ``graph`` run (forward and backward), the implementations the registry tries.
    The first that takes the arguments runs; under ``autotune``, the fastest."""
    for node in graph.nodes:
        view = view_of(node)
        if view is None:
            continue
        impl = view.arguments().get("impl", registry.AUTO)
        device = next((t.device for t in map(ir.fake, (node, *node.all_input_nodes)) if t is not None), None)
        for kernel in type(view).kernels if device is not None else ():
            try:
                names = registry.candidates(kernel, device, impl)
            except (RuntimeError, ValueError):  # the op raises the same when it runs
                continue
            chosen = record.implementations.setdefault(kernel, [])
            chosen += [name for name in names if name not in chosen]


def _distributed_identity() -> str:
    """Rank and world size when torch.distributed is initialized: collective rewrites are per rank.
    Group names are graph arguments, so the cache keys on them already."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return ""
    return f"rank={dist.get_rank()},world={dist.get_world_size()}"
