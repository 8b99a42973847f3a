"""The main job: a model's training step (or inference forward) under eager, Inductor and primus_turbo (bf16, FP8
recipes) and the peers beside them (torchao's float8, Liger-Kernel's kernels): step time, speedup, memory, compile
time and the graph breaks Dynamo made, SNR against Inductor. With no model named: transformers' Llama-3-8B, 2 layers
at its published sizes with the LM head and loss (on CPU: its tiny config). --hf: transformers' own causal LMs;
--config: the hand-written Llama-style decoders and transformers' MoE decoders. The workloads: models.py; the
columns: columns.py; the goals a GPU run is held to: goals.py.
``python -m benchmarks.run_model [--hf llama3-8b[,...] | --config llama3-8b[,...]] [--fp8 tensorwise,rowwise]
[--mode train|inference]``"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import gc
import json
from collections.abc import Callable

import torch

import turbo_inductor
from benchmarks import chart, goals, models, record
from benchmarks.columns import DEFAULT_FP8, PEERS, for_run
from benchmarks.measure import accuracy, measure, saved_for_backward, triton_knobs, warm_up_compiler

CPU_NOTE = "On CPU: timings are CPU wall-clock times, not GPU figures; GPU time, peak memory and goals are GPU-only."
# Options that do not name a run's file: the models, its mode and recipes name it otherwise; the rest change no
# figure.
UNNAMED = {"config", "hf", "tiny", "mode", "fp8", "out", "kernels", "warm_compile"}


def add_workload_arguments(parser: argparse.ArgumentParser, on_gpu: bool) -> None:
    """What runs: the models, their sizes, the columns, the mode."""
    family, name = models.DEFAULT
    default = f"--{family} {name}"
    parser.add_argument(
        "--config",
        default=None,
        help=f"hand-written decoders instead, comma-separated, from {sorted(models.DECODERS.models)}",
    )
    parser.add_argument(
        "--hf",
        default=None,
        help=f"transformers' own causal LMs, comma-separated, from {sorted(models.TRANSFORMERS.models)}: published "
        f"sizes (tiny on CPU), LM head and loss included (default: {default})",
    )
    parser.add_argument("--tiny", action="store_true", help="with --hf: each family's tiny config, as on a CPU")
    parser.add_argument(
        "--shrink",
        type=int,
        default=1,
        help="with --hf: the published sizes, every width and the vocabulary divided by N, also on a CPU. At N times "
        "fewer tokens, each tensor a step saves for its backward is N^2 times smaller than at published sizes",
    )
    parser.add_argument(
        "--layers", type=int, default=None, help="default: 2 with --hf, else 1 on GPU and the config's on CPU"
    )
    parser.add_argument("--batch", type=int, default=models.BATCH)
    parser.add_argument("--seq", type=int, default=None, help="default: 2048 with --hf, 4096 on GPU, 64 on CPU")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--fp8",
        default=",".join(DEFAULT_FP8) if on_gpu else "",
        help="FP8 recipes to add as primus_turbo columns (comma-separated; empty: none; default on a GPU: "
        f"{','.join(DEFAULT_FP8)})",
    )
    parser.add_argument(
        "--impl",
        default="",
        help="kernel implementations to add as primus_turbo columns, each as options={'impl': ...} "
        "(comma-separated, e.g. triton,native,autotune; with --fp8, also per recipe)",
    )
    parser.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help='a primus_turbo column with these backend options, e.g. \'fp8 no norms={"fp8": '
        '"tensorwise", "rmsnorm": false}\' (repeatable)',
    )
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"the peer libraries' columns, comma-separated from {','.join(PEERS)}, each where it is installed "
        "(empty: none)",
    )
    parser.add_argument("--mode", default="train", choices=("train", "inference"))


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """How each column's step runs: frozen, under autocast, with dynamic shapes."""
    parser.add_argument(
        "--freezing",
        action="store_true",
        help="inference: compile every column under torch._inductor.config.freezing (parameters "
        "become constants; the FP8 linears' weights are quantized when compiling)",
    )
    parser.add_argument(
        "--frozen-linears",
        action="store_true",
        help="train: the linears' weights want no gradient (a LoRA-style fine-tune of a frozen base "
        "model), in every column",
    )
    parser.add_argument(
        "--dynamic",
        action="store_true",
        default=None,
        help="compile every column with dynamic=True: symbolic sizes from the start (default: "
        "Dynamo's automatic dynamic shapes, after a size changes)",
    )
    parser.add_argument(
        "--autocast",
        action="store_true",
        help="parameters and input in float32, every column run under torch.autocast in --dtype "
        "(mixed-precision training as the Hugging Face Trainer runs it)",
    )


def add_measurement_arguments(parser: argparse.ArgumentParser) -> None:
    """What is measured and printed, and where the JSON goes."""
    parser.add_argument(
        "--snr-inputs",
        type=int,
        default=4,
        help="SNRs pooled over this many random inputs (signal and noise summed over them): one input's worst "
        "gradient SNR moves by ~0.1 dB between two compiles of the same arithmetic",
    )
    parser.add_argument(
        "--kernels",
        type=int,
        default=0,
        help="GPU: print the N kernels taking most GPU time per column; every kernel's time goes in the JSON",
    )
    parser.add_argument(
        "--compile-kernels",
        type=int,
        default=0,
        help="GPU: compile each column's Triton kernels in this process, one at a time, and print the N slowest to "
        "compile (the compile times are then serial ones: no compile-time goal)",
    )
    parser.add_argument(
        "--warm-compile",
        action="store_true",
        help="compile against the warm compile caches (quicker; the compile times are then no cold compiles)",
    )
    parser.add_argument("--out", default=None, help="folder for the JSON and PNG (default: $OUT, else benchmarks/out)")


def check(parser: argparse.ArgumentParser, args) -> None:
    """Refuses the combinations that cannot run, naming why."""
    if args.freezing and args.mode != "inference":
        parser.error("--freezing needs --mode inference (Inductor freezes only graphs compiled without grad)")
    if args.compile_kernels and not hasattr(getattr(triton_knobs(), "compilation", None), "listener"):
        parser.error("--compile-kernels needs Triton >= 3.4 (triton.knobs.compilation.listener)")
    if args.snr_inputs < 1:
        parser.error(f"--snr-inputs must be >= 1, got {args.snr_inputs}")
    if args.frozen_linears and args.mode != "train":
        parser.error("--frozen-linears needs --mode train (in inference no weight gets a gradient)")
    for column in args.column:
        name, _, options = column.partition("=")
        try:
            if not name or not isinstance(json.loads(options), dict):
                raise ValueError("not a JSON object")
        except ValueError as error:
            parser.error(f"--column {column!r}: expected NAME=JSON-object ({error})")
    unknown_peers = {peer for peer in args.peers.split(",") if peer} - set(PEERS)
    if unknown_peers:
        parser.error(f"--peers: unknown {sorted(unknown_peers)}; choose from {list(PEERS)}")
    if args.hf is not None and args.config is not None:
        parser.error("--config and --hf: give one of them")
    if (args.tiny or args.shrink != 1) and args.config is not None:
        parser.error("--tiny and --shrink go with --hf (the tiny decoder is --config tiny)")
    if args.tiny and args.shrink != 1:
        parser.error("--tiny or --shrink: give one of them")
    if args.shrink < 1:
        parser.error(f"--shrink must be at least 1, got {args.shrink}")


def arguments(argv, on_gpu: bool) -> tuple[argparse.Namespace, list[str], list[str]]:
    """The run's arguments with every default filled in (the model named where none was, its sequence, tiny on a
    CPU), the models it runs, and the options its file is named by."""
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    add_workload_arguments(parser, on_gpu)
    add_step_arguments(parser)
    add_measurement_arguments(parser)
    args = parser.parse_args(argv)
    check(parser, args)
    # the options this run's file is named by, before the defaults that depend on the model are filled in
    named_options = record.changed_options(parser, args, ignore=UNNAMED)
    if args.hf is None and args.config is None:
        setattr(args, *models.DEFAULT)
    option = "hf" if args.hf is not None else "config"
    family = models.FAMILIES[option]
    names = [name for name in getattr(args, option).split(",") if name]
    unknown = [name for name in names if name not in family.models]
    if unknown or not names:
        choices = sorted(family.models)
        parser.error(f"{family.option}: unknown model {unknown or getattr(args, option)!r}; choose from {choices}")
    args.tiny = args.tiny or not (on_gpu or args.shrink > 1)  # a CPU runs the tiny configs unless told
    if args.seq is None:
        args.seq = family.seq(on_gpu)
    if option == "config":
        args.config = ",".join(names)  # the configuration records the models that ran
    return args, names, named_options


def main(argv=None) -> None:
    on_gpu = torch.cuda.is_available()
    args, names, named_options = arguments(argv, on_gpu)
    family = models.FAMILIES["hf" if args.hf else "config"]
    configuration = {
        **{key: value for key, value in vars(args).items() if key not in ("out", "kernels")},
        "models": {name: family.describe(args, name, on_gpu) for name in names},
    }
    recipes = [recipe for recipe in args.fp8.split(",") if recipe]
    parts = ["hf" if args.hf else "", "-".join(names), args.mode, f"fp8-{'-'.join(recipes)}" if recipes else ""]
    parts += named_options
    if not on_gpu:
        print(CPU_NOTE)
    rows, held = [], []

    def write(partial: list[dict], quiet: bool = True) -> str:
        """The JSON of the rows so far and ``partial``, with the finished models' goals."""
        extra = {"goals": held} if on_gpu else {}
        return record.write("model", parts, configuration, rows + partial, args.out, quiet=quiet, **extra)

    with torch._inductor.config.patch(freezing=args.freezing):  # global: Dynamo reads it, an option would not reach it
        for name in names:
            table = run_workload(args, family, name, on_gpu, write)
            rows += table
            if on_gpu:
                held += [{"model": name, **line} for line in goals.evaluate(table, configuration, name)]
            # written after each model, and before each column: a run stopped by a time limit or a crash keeps what
            # it measured
            path = write([], quiet=False)
    for line in held:
        print(f"goal: {line['model']}: {line['goal']}: {line['measured']} -> {'met' if line['met'] else 'MISSED'}")
    for name in names:  # GPU figures: a CPU run records no peak memory
        for line in goals.lighter_peers([row for row in rows if row["model"] == name]):
            print(f"peak memory: {name}: {line}")
        for line in goals.peers_off_inductor([row for row in rows if row["model"] == name]):
            print(f"loss off Inductor's, relative: {name}: {line}")
    chart.write_chart(path)


def run_workload(
    args, family: models.Family, model_name: str, on_gpu: bool, checkpoint: Callable[[list[dict]], None]
) -> list[dict]:
    """Every column on the model ``model_name``: its rows of the table, printed. Before each column after Inductor's,
    ``checkpoint`` gets the rows so far and that column's as ended: a peer's kernel that ends the process (a
    segmentation fault) leaves its column named in the JSON, beside the columns measured before it."""
    device, dtype = ("cuda" if on_gpu else "cpu"), getattr(torch, args.dtype)
    autocast_dtype, dtype = (dtype, torch.float32) if args.autocast else (None, dtype)
    torch.manual_seed(0)
    # What was allocated before this model was built is no part of its peaks: a peer's model, with its gradients, can
    # outlive its column and stay under every column of the next model.
    outside = torch.cuda.memory_allocated() if on_gpu else 0
    work = family.build(args, model_name, on_gpu, device, dtype)
    if args.frozen_linears:
        for module in work.base.modules():
            if isinstance(module, torch.nn.Linear):
                module.requires_grad_(False)
    print(f"{work.title}, batch {args.batch} x seq {args.seq}, {args.dtype}, {device}, {_step_kind(args)}")
    columns = for_run(args, work, device)
    from tqdm import tqdm  # comes with transformers; the progress of minutes-long compiles and measurements

    if on_gpu:  # a CPU's compile times are no goal
        warm_up_compiler(device)
    results, waiting, reference = {}, {}, None  # waiting: columns' outputs and gradients, until Inductor's are there
    progress = tqdm(columns, desc="columns", unit="column")
    allocated_before = torch.cuda.memory_allocated() - outside if on_gpu else 0  # the model's own
    for column in progress:
        progress.set_description(f"compiling and timing {column.name}")
        if "inductor" in results:  # the reference of every row's figures
            checkpoint(table_rows(args, work, model_name, {**results, column.name: {"error": ENDED}}, on_gpu))
        name, results[column.name], samples = run_column(args, work, column, device, allocated_before, autocast_dtype)
        if name != column.name:  # measured eagerly after its compile failed
            results[name] = results.pop(column.name)
        if samples is None:
            continue
        waiting[name] = samples
        if name == "inductor":
            reference = samples
        if reference is not None:  # compared on the device, and freed: no column's tensors stay in later ones' peak
            for done in list(waiting):
                results[done]["accuracy"] = accuracy(waiting.pop(done), reference, work.hf, args.mode == "train")
    table = table_rows(args, work, model_name, results, on_gpu)
    print_table(table)
    return table


# A column's row while it runs, in the JSON: the row it leaves where the process ends in it.
ENDED = "the process ended in this column (see the log)"


@dataclasses.dataclass
class Step:
    """A column's step on the workload's input: ``run`` (the model as the column runs it) forward, in training also
    backward, under autocast where asked."""

    work: models.Workload
    model: torch.nn.Module
    train: bool
    device: str
    autocast_dtype: torch.dtype | None
    run: Callable | None = None

    def __call__(self) -> torch.Tensor:
        inputs = self.work.inputs
        with torch.autocast(self.device, self.autocast_dtype, enabled=self.autocast_dtype is not None):
            if not self.train:
                with torch.no_grad():
                    return self.run(inputs)
            inputs.grad = None
            self.model.zero_grad(set_to_none=True)
            out = self.run(inputs)
        self.work.backward(out)
        return out

    def gradients(self) -> dict:
        return self.work.gradients(self.model)

    def samples(self, measured: dict, inputs: int) -> dict:
        """The outputs and gradients on ``inputs`` inputs, for the SNRs: the timed input's (``measured``'s), then each
        other's; the timed input is drawn back for the next column."""
        samples = {"out": [measured.pop("out")], "grads": [measured.pop("grads")]}
        for k in range(1, inputs):
            self.work.draw(k)
            samples["out"].append(self().detach())
            samples["grads"].append({p: g.detach() for p, g in self.gradients().items() if g is not None})
        self.work.draw(0)
        return samples


def run_column(args, work, column, device: str, allocated_before: int, autocast_dtype) -> tuple[str, dict, dict]:
    """One column measured on a fresh copy of the model: its name (which says where it ran eagerly instead), its
    figures, and its outputs and gradients on each of --snr-inputs inputs (None where the column failed)."""
    torch._dynamo.reset()
    turbo_inductor.reset_records()
    # What earlier columns left allocated is no part of this one's peak: a frozen graph's constants (W's FP8 copy)
    # stay in its generated module, which Inductor keeps loaded (sys.modules) after torch._dynamo.reset(). The last
    # column's model went with its call; its input gradient goes first: freed in this column, it would be taken off
    # twice.
    work.inputs.grad = None
    gc.collect()
    left_over = torch.cuda.memory_allocated() - allocated_before if device == "cuda" else 0
    step = Step(work, copy.deepcopy(work.base), args.mode == "train", device, autocast_dtype)
    cold = not args.warm_compile
    measured = functools.partial(
        measure, step, step.gradients, device, args.kernels, left_over, cold, args.compile_kernels
    )
    name = column.name
    with contextlib.ExitStack() as patches:  # what a peer patches outside its model holds for its column alone
        try:
            step.run = column.prepare(step.model, args.dynamic, patches)
            try:
                result = measured()
            except Exception:
                if not column.eager_on_failure:
                    raise
                step.run, name = step.model, f"{name} (eager: compile failed)"
                result = measured()
        except Exception as error:  # a column that fails is reported, the others still run
            cause = getattr(error, "inner_exception", None) or error  # Dynamo wraps backend errors
            return name, {"error": f"{type(cause).__name__}: {str(cause).strip()[:160]}"}, None
        if column.backend == "primus_turbo":
            result["rewrites"] = turbo_inductor.rewrite_counts()
            print(f"{name} fused:", result["rewrites"])
        if step.train:
            result.update(saved_for_backward(step, work.draw))
            kinds = ", ".join(f"{kind} {gib:.3f}" for kind, gib in result["saved_gib_by_kind"].items())
            print(f"    saved for the backward {result['saved_gib']:.3f} GiB: {kinds}")
        return name, result, step.samples(result, args.snr_inputs)


def table_rows(args, work, model_name: str, results: dict, on_gpu: bool) -> list[dict]:
    """The run's rows of ``model_name``: a failed column's error, else its figures. What this machine cannot measure
    is left out: GPU time and peak memory on CPU, gradients in inference."""
    ref = results["inductor"]
    tokens = args.batch * args.seq
    flops = work.flops / (1 if args.mode == "train" else 3)  # forward: a third
    table = []
    for name, r in results.items():
        if "error" in r:
            table.append({"model": model_name, "column": name, "error": r["error"]})
            continue
        table.append(
            {
                "model": model_name,
                "column": name,
                "step_ms": r["ms"],
                **({"gpu_ms": r["gpu_ms"]} if on_gpu else {}),
                "tokens_per_s": tokens / r["ms"] * 1e3,
                "model_tflops": flops / r["ms"] / 1e9,
                "speedup_vs_inductor": ref["ms"] / r["ms"],
                **({"peak_gib": r["peak_gib"]} if on_gpu else {}),
                **{key: r[key] for key in ("saved_gib", "saved_gib_by_kind") if key in r},
                "compile_s": r["compile_s"],
                "compile_phases": r["compile_phases"],
                "graphs": r["graphs"],
                "graph_breaks": r["graph_breaks"],
                **{key: r[key] for key in OPTIONAL_FIGURES if key in r},
                **r["accuracy"],
                "rewrites": r.get("rewrites", {}),
            }
        )
    return table


# What a column's row holds where its measurement took it: the slowest Triton compiles (--compile-kernels), torch's TTIR
# of our kernels, the kernel table by name and by launch grid (--kernels).
OPTIONAL_FIGURES = ("triton_compiles", "compile_kernel_ttir", "kernels_us", "launches_us")


# The printed table: header, row key, format; a column no row has is left out.
TABLE = (
    ("step ms", "step_ms", "{:9.3f}"),
    ("GPU ms", "gpu_ms", "{:8.3f}"),
    ("tokens/s", "tokens_per_s", "{:10.0f}"),
    ("TFLOP/s", "model_tflops", "{:8.1f}"),
    ("vs inductor", "speedup_vs_inductor", "{:11.2f}x"),
    ("peak GiB", "peak_gib", "{:9.2f}"),
    ("saved GiB", "saved_gib", "{:10.3f}"),
    ("compile s", "compile_s", "{:10.1f}"),
    ("graph breaks", "graph_breaks", "{:12d}"),
    ("out SNR dB", "out_snr_db", "{:11.1f}"),
    ("dx SNR dB", "dx_snr_db", "{:10.1f}"),
    ("loss SNR dB", "loss_snr_db", "{:12.1f}"),
    ("logits SNR dB", "logits_snr_db", "{:14.1f}"),
    ("worst grad SNR dB", "worst_grad_snr_db", "{:18.1f}"),
)


def print_table(table: list[dict]) -> None:
    fields = [field for field in TABLE if any(field[1] in row for row in table)]
    print(f"{'backend':28s} " + " ".join(f"{header:>{len(fmt.format(0))}s}" for header, _, fmt in fields))
    for row in table:
        if "error" in row:
            print(f"{row['column']:28s} failed: {row['error']}")
            continue
        print(f"{row['column']:28s} " + " ".join(fmt.format(row[key]) for _, key, fmt in fields))


def _step_kind(args) -> str:
    kind = "training step" if args.mode == "train" else "inference forward" + (", frozen" if args.freezing else "")
    return (
        kind
        + (", linears frozen" if args.frozen_linears else "")
        + (", autocast" if args.autocast else "")
        + (", dynamic=True" if args.dynamic else "")
    )


if __name__ == "__main__":
    main()
