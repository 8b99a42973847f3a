"""How the main job measures a column: its cold compile by phase, its step time (on a GPU also its kernel time and
peak memory), and its numerics against Inductor's column as SNRs."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import pathlib
import statistics
import tempfile
import time

import torch

import turbo_inductor

# A compile's phases: torch's own timers, and ours for the passes. What none of them covers (AOTAutograd's tracing,
# the scheduler, guards, the first run) is "other".
COMPILE_TIMERS = {
    "dynamo": "bytecode_tracing",
    "lowering": "GraphLowering.run",
    "codegen": "GraphLowering.codegen",
    "triton wait": "async_compile.wait",  # Triton kernels compiling in Inductor's worker processes
}


def time_ms(step, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        # The median of 1.5 s of steps: 25 or more of a 2-layer model at published sizes. Over 5 steps one tree's
        # ratios moved by 1% between runs.
        return do_bench(step, warmup=25, rep=1500, return_mode="median")
    times = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def warm_up_compiler(device: str) -> None:
    """One small Inductor compile: what a process pays once (Inductor's compile workers starting, imports) is then
    in no column's compile time. Without it, the first column compiled 4.4 s of Triton kernels in this process
    while the workers started (Llama-3 prefill on an H200)."""
    from torch._inductor.utils import fresh_inductor_cache

    x = torch.randn(64, 64, device=device)
    with fresh_inductor_cache():
        torch.compile(lambda a: torch.softmax(a @ a, dim=-1), backend="inductor")(x)
    torch._dynamo.reset()


def measure(
    step, gradients, device: str, kernels: int = 0, left_over: int = 0, cold: bool = True, compile_kernels: int = 0
) -> dict:
    """A compile (the first step; ``cold``: with an empty Inductor cache), then the step's time (on a GPU also its
    kernel time and peak memory, less ``left_over`` bytes of earlier columns), its output and ``gradients()`` (on
    the device); prints ``kernels`` kernels, and with ``compile_kernels`` the Triton kernels slowest to compile."""
    from torch._inductor.utils import fresh_inductor_cache

    timers, compiles = compile_timers(), []
    ttir = {"calls": 0, "distinct": 0, "seconds": 0.0, "answered": 0, "declared": 0}
    dynamo_before = dynamo_counts()
    start = time.perf_counter()
    with (
        fresh_inductor_cache() if cold else contextlib.nullcontext(),
        triton_compiles(compiles) if compile_kernels else contextlib.nullcontext(),
        kernel_ttir(ttir),
    ):
        out = step().detach()
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    phases = compile_phases(timers, compile_s)
    compiled = any(s for phase, s in phases.items() if phase != "other")  # not the eager column
    if compiled:
        print("    compile", ", ".join(f"{phase} {s:.1f} s" for phase, s in phases.items()))
    if ttir["calls"] or ttir["declared"]:
        print(
            f"    of which torch's TTIR of user-defined Triton kernels: {ttir['calls']} calls "
            f"({ttir['distinct']} distinct), {ttir['seconds']:.1f} s; launches answered without one: "
            f"{ttir['answered']} from memory, {ttir['declared']} by their kernel's declaration"
        )
    graphs = dynamo_graphs(dynamo_before)
    result = {"ms": time_ms(step, device), "compile_s": compile_s, "compile_phases": phases, "out": out, **graphs}
    result["compile_kernel_ttir"] = ttir
    if compile_kernels and compiled:
        result["triton_compiles"] = slowest_compiles(compiles, compile_kernels)
    if device == "cuda":
        result.update(gpu_figures(step, left_over, kernels))
    result["grads"] = {name: grad.detach() for name, grad in gradients().items() if grad is not None}
    return result


def dynamo_counts() -> tuple[int, collections.Counter]:
    """(graphs Dynamo compiled, its graph breaks by reason) in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], collections.Counter(counters["graph_break"])


def dynamo_graphs(before: tuple[int, collections.Counter]) -> dict:
    """{"graphs", "graph_breaks"} since ``before`` (:func:`dynamo_counts`): what a step compiled as how many graphs,
    and where Dynamo broke it (a peer's kernels it cannot trace then run eagerly between them). The commonest reasons
    are printed."""
    graphs, breaks = dynamo_counts()
    breaks.subtract(before[1])
    reasons = +breaks  # those that grew
    if reasons:
        print(f"    graph breaks: {sum(reasons.values())}, the commonest:")
        for reason, count in reasons.most_common(3):
            print(f"      {count} x {' '.join(reason.split())[:140]}")
    return {"graphs": graphs - before[0], "graph_breaks": sum(reasons.values())}


def slowest_compiles(compiles: list[tuple[str, float]], shown: int) -> dict:
    """How many Triton kernels compiled, in how long: printed with the ``shown`` slowest."""
    compiles.sort(key=lambda kernel: -kernel[1])
    total = {"kernels": len(compiles), "seconds": sum(s for _, s in compiles)}
    print(f"    Triton compiles: {len(compiles)} kernels, {total['seconds']:.1f} s")
    for name, s in compiles[:shown]:
        print(f"    {s:7.2f} s  {name[:110]}")
    return total


def gpu_figures(step, left_over: int, kernels: int) -> dict:
    """One step's peak memory (GiB, less ``left_over`` bytes) and kernel time (ms); with ``kernels``, every kernel's
    GPU time per step (``kernels_us``, the table a floor argument rests on), printing the ``kernels`` slowest, and
    per launch grid too (``launches_us``: which operand a quantization kernel's time went to)."""
    from benchmarks.common import device_us, launch_us, profiled

    # One step's peak, on its own: do_bench's 256 MiB cache-flushing buffer is allocated during its timed steps.
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak_gib = (torch.cuda.max_memory_allocated() - left_over) / 2**30
    prof = profiled(step, steps=5)
    per_kernel = sorted(device_us(prof, 5).items(), key=lambda item: -item[1])
    for kernel, us in per_kernel[:kernels]:
        print(f"    {us:9.1f} us  {kernel[:110]}")
    figures = {"peak_gib": peak_gib, "gpu_ms": sum(us for _, us in per_kernel) / 1e3}
    if not kernels:
        return figures
    with tempfile.TemporaryDirectory() as folder:
        prof.export_chrome_trace(f"{folder}/trace.json")
        trace = json.loads(pathlib.Path(f"{folder}/trace.json").read_text())
    launches = sorted(launch_us(trace, 5).items(), key=lambda item: -item[1])
    return figures | {"kernels_us": dict(per_kernel), "launches_us": dict(launches)}


def saved_for_backward(step, draw) -> dict:
    """What a training step's forward keeps for its backward beyond the parameters, in GiB by kind and dtype:
    ``activations`` depend on the input, ``weights and constants`` do not (FP8 copies of W, tables, masks).
    Told apart by content over two inputs (``draw(k)`` writes input k; input 0 is drawn back), since a weight copy
    and an activation can share a shape. Measured on any device: the forward saves the same tensors on CPU."""
    first, second = _saved_tensors(step, draw, 1, copy=True), _saved_tensors(step, draw, 0)
    pairs = len(first) == len(second) and all(
        (a.shape, a.dtype) == (b.shape, b.dtype) for (_, _, a), (_, _, b) in zip(first, second)
    )
    constant, held = {}, {}  # per storage: a storage saved twice is held once, constant if all it holds is
    for (storage, nbytes, t), (_, _, u) in zip(first, second if pairs else first):
        constant[storage] = constant.get(storage, True) and pairs and _equal(t, u)
        held[storage] = (str(t.dtype).removeprefix("torch."), nbytes)
    by_kind: dict[str, float] = {}
    for storage, (dtype, nbytes) in held.items():
        kind = f"{'weights and constants' if constant[storage] else 'activations'} {dtype}"
        by_kind[kind] = by_kind.get(kind, 0.0) + nbytes / 2**30
    return {"saved_gib": sum(by_kind.values()), "saved_gib_by_kind": dict(sorted(by_kind.items()))}


def _saved_tensors(step, draw, k: int, copy: bool = False) -> list[tuple[int, int, torch.Tensor]]:
    """(storage, its bytes, tensor) for each tensor a step on input ``k`` saved for its backward, held past it,
    except the parameters and buffers. ``copy``: tensors as they were then, not as the next input, drawn in place,
    leaves a saved input."""
    kept = {t.untyped_storage().data_ptr() for t in (*step.model.parameters(), *step.model.buffers())}
    saved = []

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in kept:
            saved.append((storage.data_ptr(), storage.nbytes(), t.detach().clone() if copy else t.detach()))
        return t

    draw(k)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return saved


def _equal(a, b) -> bool:
    """Bitwise equality; one-byte dtypes (FP8) compared as bytes, which torch.equal may not support."""
    if a.element_size() == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a, b)


def compile_timers() -> dict[str, float]:
    """Seconds so far per timer of COMPILE_TIMERS (torch sums them over the process), and in our passes."""
    from torch._dynamo.utils import compilation_time_metrics

    timers = {phase: sum(compilation_time_metrics.get(name, ())) for phase, name in COMPILE_TIMERS.items()}
    timers["passes"] = sum(sum(record.seconds.values()) for record in turbo_inductor.compile_records())
    return timers


def triton_knobs():
    """Triton's knobs module, or None (Triton < 3.4)."""
    try:
        import triton.knobs
    except ImportError:
        return None
    return triton.knobs


@contextlib.contextmanager
def kernel_ttir(total: dict):
    """Counts into ``total`` the calls, distinct calls and seconds of torch's TTIR of user-defined Triton kernels
    (ours, launched from traced op bodies): torch reads what each launch reads and writes from it, as AOTAutograd
    traces and again as Inductor lowers, within those phases' times. Distinct: by the kernel, its arguments' dtypes,
    its other arguments' values, symbolic sizes alike, finer than ``access_analysis``'s keys (Triton's
    specialization), so each launch it analyzed counts once. Answered: the analyses of launches that
    ``access_analysis`` answered without a TTIR from memory; declared: by their kernel's declaration (torch 2.11)."""
    from torch._higher_order_ops import triton_kernel_wrap

    from turbo_inductor.kernels.triton import access_analysis

    generate, seen = triton_kernel_wrap.generate_ttir, set()
    before = access_analysis.counts()

    def timed(kernel, kwargs, *args, **rest):
        start = time.perf_counter()
        try:
            return generate(kernel, kwargs, *args, **rest)
        finally:
            total["calls"] += 1
            total["seconds"] += time.perf_counter() - start
            seen.add((id(kernel), *((name, _ttir_input(value)) for name, value in sorted(kwargs.items()))))
            total["distinct"] = len(seen)

    triton_kernel_wrap.generate_ttir = timed
    try:
        yield
    finally:
        triton_kernel_wrap.generate_ttir = generate
        after = access_analysis.counts()
        total["answered"] = after["answered"] - before["answered"]
        total["declared"] = after["declared"] - before["declared"]


def _ttir_input(value) -> str:
    """A kernel argument as the TTIR sees it: a tensor's dtype, "symbolic" for a symbolic size, else its value."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) or type(value).__module__.startswith("sympy"):
        return "symbolic"
    dtype = getattr(value, "dtype", None)
    return f"tensor {dtype}" if dtype is not None and not isinstance(value, (int, float, bool)) else repr(value)


@contextlib.contextmanager
def triton_compiles(compiles: list):
    """Appends (kernel, seconds) to ``compiles`` for each Triton kernel compiled in this process; Inductor compiles
    its kernels here too (compile_threads=1), one at a time, so that each is seen."""
    compilation = triton_knobs().compilation

    def listener(src, metadata, metadata_group, times, cache_hit):
        if not cache_hit:
            name = getattr(src, "name", None) or getattr(getattr(src, "fn", None), "__name__", "?")
            compiles.append((name, times.total / 1e6))  # microseconds

    previous, compilation.listener = compilation.listener, listener
    try:
        with torch._inductor.config.patch(compile_threads=1):
            yield
    finally:
        compilation.listener = previous


def compile_phases(before: dict[str, float], compile_s: float) -> dict[str, float]:
    """Seconds per phase since ``before`` (:func:`compile_timers`), of a compile that took ``compile_s``."""
    phases = {phase: s - before[phase] for phase, s in compile_timers().items()}
    return {**phases, "other": compile_s - sum(phases.values())}


def accuracy(measured: dict, reference: dict, hf_model: bool, train: bool) -> dict:
    """SNRs against Inductor's column, each pooled over the inputs: the output's (with --hf the loss's or logits'),
    and in training the input gradient's (dx), with --hf the worst parameter gradient's, its name, and its SNR on
    each input alone."""
    output = ("loss_snr_db" if train else "logits_snr_db") if hf_model else "out_snr_db"
    snrs = {output: snr_db(measured["out"], reference["out"])}
    grads, reference_grads = measured["grads"], reference["grads"]
    if train and hf_model:
        per_parameter = {
            name: snr_db([g[name] for g in grads], [g[name] for g in reference_grads]) for name in reference_grads[0]
        }
        worst = min(per_parameter, key=per_parameter.get)
        snrs["worst_grad_snr_db"] = per_parameter[worst]
        snrs["worst_grad"] = worst if math.isfinite(per_parameter[worst]) else None  # None: every one is exact
        if math.isfinite(per_parameter[worst]):
            pairs = zip(grads, reference_grads)
            snrs["worst_grad_snr_db_per_input"] = [snr_db([g[worst]], [r[worst]]) for g, r in pairs]
    elif train:
        snrs["dx_snr_db"] = snr_db([g["x"] for g in grads], [g["x"] for g in reference_grads])
    return snrs


def snr_db(outs: list, refs: list) -> float:
    """10 log10(sum |ref|^2 / sum |out - ref|^2) over pairs of tensors: the numerical difference to Inductor (inf
    when identical: null in JSON)."""
    noise = sum((out.double() - ref.double()).pow(2).sum().item() for out, ref in zip(outs, refs, strict=True))
    signal = sum(ref.double().pow(2).sum().item() for ref in refs)
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)
