"""The main job: a Llama-style decoder's training step (or inference forward) under eager, Inductor and primus_turbo
(bf16, FP8 recipes, torchao's float8 beside them): step time, speedup, memory, compile time, SNR against Inductor.
MoE configs (mixtral-8x7b, qwen3-30b-a3b) build transformers' MoE decoders, with torchao's MoE training beside them.
``python -m benchmarks.run_model [--config llama3-8b[,...]] [--fp8 tensorwise,rowwise] [--mode train|inference]``"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.util
import json
import math
import statistics
import time

import torch

import turbo_inductor
from benchmarks import record, report
from turbo_inductor.testing.llama import CONFIGS as LLAMA_CONFIGS
from turbo_inductor.testing.llama import LlamaDecoder
from turbo_inductor.testing.moe import MOE_CONFIGS

# Llama-style decoders, and MoE decoders built from transformers' classes (their configs build them)
CONFIGS = {**LLAMA_CONFIGS, **MOE_CONFIGS}

# FP8 recipes torchao has under the same names (a torchao column is added for each one requested), and those whose
# torchao configs primus_turbo runs on its own fp8_linear (a column of the torchao model compiled by primus_turbo).
TORCHAO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
TORCHAO_ON_OURS = ("tensorwise", "rowwise")
# The goals for a layer's training step on a GPU: bf16 speedup over Inductor at no more peak memory, the FP8
# recipes' speedup over Inductor in bf16, and every primus_turbo column's cold compile time over Inductor's.
BF16_GOAL, FP8_GOAL, FP8_GOAL_RECIPES, COMPILE_GOAL = 1.05, 1.40, ("tensorwise", "rowwise"), 1.25
CPU_NOTE = "On CPU: timings are CPU wall-clock times, not GPU figures; GPU time, memory and goals are GPU-only."


def time_ms(step, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(step, warmup=25, rep=200, return_mode="median")
    times = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv=None):
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument(
        "--config",
        default="llama3-8b" if on_gpu else "tiny",
        help=f"model shapes, comma-separated, from {sorted(CONFIGS)}",
    )
    parser.add_argument("--layers", type=int, default=None, help="default: 1 on GPU, the config's on CPU")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096 if on_gpu else 64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--fp8",
        default=",".join(FP8_GOAL_RECIPES) if on_gpu else "",
        help="FP8 recipes to add as primus_turbo columns (comma-separated; empty: none; default on a GPU: "
        f"{','.join(FP8_GOAL_RECIPES)})",
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
    parser.add_argument("--mode", default="train", choices=("train", "inference"))
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
    parser.add_argument(
        "--kernels", type=int, default=0, help="GPU: print the N kernels taking most GPU time per column"
    )
    parser.add_argument(
        "--warm-compile",
        action="store_true",
        help="compile against the warm compile caches (quicker; the compile times are then no cold compiles)",
    )
    parser.add_argument("--out", default=None, help="folder for the JSON and PNG (default: $OUT, else benchmarks/out)")
    args = parser.parse_args(argv)
    if args.freezing and args.mode != "inference":
        parser.error("--freezing needs --mode inference (Inductor freezes only graphs compiled without grad)")
    if args.frozen_linears and args.mode != "train":
        parser.error("--frozen-linears needs --mode train (in inference no weight gets a gradient)")
    for column in args.column:
        name, _, options = column.partition("=")
        try:
            if not name or not isinstance(json.loads(options), dict):
                raise ValueError("not a JSON object")
        except ValueError as error:
            parser.error(f"--column {column!r}: expected NAME=JSON-object ({error})")
    names = [name for name in args.config.split(",") if name]
    unknown = [name for name in names if name not in CONFIGS]
    if unknown or not names:
        parser.error(f"--config: unknown model {unknown or args.config!r}; choose from {sorted(CONFIGS)}")
    if not on_gpu:
        print(CPU_NOTE)
    rows, goal_lines = [], []
    with torch._inductor.config.patch(freezing=args.freezing):  # global: Dynamo reads it, an option would not reach it
        for name in names:
            table = run_config(args, name, on_gpu)
            rows += table
            if on_gpu:
                goal_lines += [{"model": name, **line} for line in goals(table)]
    for line in goal_lines:
        print(f"goal: {line['model']}: {line['goal']}: {line['measured']} -> {'met' if line['met'] else 'MISSED'}")
    models = {name: {**model_config(args, name, on_gpu).__dict__} for name in names}
    configuration = {
        **{key: value for key, value in vars(args).items() if key not in ("out", "kernels")},
        "models": models,
    }
    recipes = [recipe for recipe in args.fp8.split(",") if recipe]
    parts = ["-".join(names), args.mode, f"fp8-{'-'.join(recipes)}" if recipes else ""]
    parts += record.changed_options(parser, args, ignore={"config", "mode", "fp8", "out", "kernels", "warm_compile"})
    extra = {"goals": goal_lines} if on_gpu else {}
    path = record.write("model", parts, configuration, rows, args.out, **extra)
    report.write_chart(path)


def model_config(args, model_name: str, on_gpu: bool):
    """The model's shapes, with the layer count asked for (one on a GPU by default)."""
    config = CONFIGS[model_name]
    if args.layers or on_gpu:
        config = type(config)(**{**config.__dict__, "layers": args.layers or 1})
    return config


def run_config(args, model_name: str, on_gpu: bool) -> list[dict]:
    """Every column on the model ``model_name``: its rows of the table, printed."""
    device, dtype = ("cuda" if on_gpu else "cpu"), getattr(torch, args.dtype)
    autocast_dtype, dtype = (dtype, torch.float32) if args.autocast else (None, dtype)
    config = model_config(args, model_name, on_gpu)
    torch.manual_seed(0)
    moe = hasattr(config, "build")
    base = (config.build() if moe else LlamaDecoder(config)).to(device, dtype)
    if args.frozen_linears:
        for module in base.modules():
            if isinstance(module, torch.nn.Linear):
                module.requires_grad_(False)
    train = args.mode == "train"
    x = torch.randn(args.batch, args.seq, config.hidden, device=device, dtype=dtype, requires_grad=train)
    cotangent = torch.randn_like(x)
    print(
        f"{model_name} x{config.layers} layer(s), batch {args.batch} x seq {args.seq}, {args.dtype}, {device}, "
        f"{_step_kind(args)}"
    )

    columns = [("eager", "eager", None), ("inductor", "inductor", None), ("primus_turbo", "primus_turbo", None)]
    recipes = [recipe for recipe in args.fp8.split(",") if recipe]
    columns += [(f"primus_turbo fp8 {recipe}", "primus_turbo", {"fp8": recipe}) for recipe in recipes]
    impls = [impl for impl in args.impl.split(",") if impl]
    columns += [
        (
            f"primus_turbo{f' fp8 {recipe}' if recipe else ''} impl={impl}",
            "primus_turbo",
            {"impl": impl, **({"fp8": recipe} if recipe else {})},
        )
        for impl in impls
        for recipe in [""] + recipes
    ]
    columns += [
        (f"primus_turbo {name}", "primus_turbo", json.loads(options))
        for name, _, options in (column.partition("=") for column in args.column)
    ]
    # torchao's float8 training compiled by Inductor (the peer), and the same model compiled by primus_turbo, which
    # runs torchao's linears on our fp8_linear where their recipe is one of ours (passes/torchao_float8.py)
    if importlib.util.find_spec("torchao") is not None and moe:
        # torchao's MoE training: its FP8 rowwise grouped GEMMs on the experts (the other linears stay bf16)
        columns.append(("torchao moe fp8 rowwise", "inductor", {"torchao_moe": "rowwise"}))
    elif importlib.util.find_spec("torchao") is not None:
        columns += [
            (f"torchao fp8 {recipe}", "inductor", {"torchao": recipe})
            for recipe in recipes
            if recipe in TORCHAO_RECIPES
        ]
        columns += [
            (f"torchao fp8 {recipe} on primus_turbo", "primus_turbo", {"torchao": recipe})
            for recipe in recipes
            if recipe in TORCHAO_ON_OURS
        ]
    results = {}
    from tqdm import tqdm  # comes with transformers; the progress of minutes-long compiles and measurements

    progress = tqdm(columns, desc="columns", unit="column")
    allocated_before = torch.cuda.memory_allocated() if on_gpu else 0
    for name, backend, options in progress:
        progress.set_description(f"compiling and timing {name}")
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        # What earlier columns left allocated is no part of this one's peak: a frozen graph's constants (W's FP8
        # copy) stay in its generated module, which Inductor keeps loaded (sys.modules) after torch._dynamo.reset().
        # The last column's model and input gradient go first: freed in this column, they would be taken off twice.
        model = run = x.grad = None
        gc.collect()
        left_over = torch.cuda.memory_allocated() - allocated_before if on_gpu else 0
        model = copy.deepcopy(base)
        if options and "torchao" in options:  # a model converted by torchao
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(options["torchao"]))
            run = torch.compile(model, backend=backend, dynamic=args.dynamic)
        elif options and "torchao_moe" in options:
            from torchao.prototype.moe_training.config import Float8TrainingOpConfig
            from torchao.quantization import quantize_

            quantize_(model, Float8TrainingOpConfig(), filter_fn=lambda module, fqn: fqn.endswith("experts"))
            run = torch.compile(model, backend=backend, dynamic=args.dynamic)
        else:
            run = (
                model
                if backend == "eager"
                else torch.compile(model, backend=backend, options=options, dynamic=args.dynamic)
            )

        def step():
            with torch.autocast(device, autocast_dtype, enabled=autocast_dtype is not None):
                if not train:
                    with torch.no_grad():
                        return run(x)
                x.grad = None
                model.zero_grad(set_to_none=True)
                out = run(x)
            out.backward(cotangent.to(out.dtype))
            return out

        try:
            try:
                results[name] = measure(step, x, device, args.kernels, left_over, not args.warm_compile)
            except Exception:
                if not (options and "torchao_moe" in options):
                    raise
                # torchao's compiled MoE training fails on Hopper (ao#4048): measured eagerly, as the column says
                run, name = model, f"{name} (eager: compile failed)"
                results[name] = measure(step, x, device, args.kernels, left_over, not args.warm_compile)
        except Exception as error:  # a column that fails is reported, the others still run
            cause = getattr(error, "inner_exception", None) or error  # Dynamo wraps backend errors
            results[name] = {"error": f"{type(cause).__name__}: {str(cause).strip()[:160]}"}
            continue
        if backend == "primus_turbo":
            results[name]["rewrites"] = turbo_inductor.rewrite_counts()
            print(f"{name} fused:", results[name]["rewrites"])

    ref = results["inductor"]
    tokens = args.batch * args.seq
    flops = model_flops(base, config, args.batch, args.seq) / (1 if train else 3)  # forward: a third
    table = []
    for name, r in results.items():
        if "error" in r:
            table.append({"model": model_name, "column": name, "error": r["error"]})
            continue
        # What this machine cannot measure is left out: GPU time and peak memory on CPU, dx in inference.
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
                "compile_s": r["compile_s"],
                "out_snr_db": snr_db(r["out"], ref["out"]),
                **({"dx_snr_db": snr_db(r["grad"], ref["grad"])} if train else {}),
                "rewrites": r.get("rewrites", {}),
            }
        )
    print_table(table)
    return table


def goals(table: list[dict]) -> list[dict]:
    """A GPU run's values against the goals (BF16_GOAL, FP8_GOAL, COMPILE_GOAL), for the columns present; a speedup
    goal carries its ``target_speedup`` (the chart draws it)."""
    rows = {row["column"]: row for row in table if "error" not in row}
    inductor, report = rows["inductor"], []
    if "primus_turbo" in rows:
        bf16 = rows["primus_turbo"]
        report.append(
            {
                "goal": f"primus_turbo bf16 >= {BF16_GOAL:.2f}x Inductor at no more peak memory",
                "measured": f"{bf16['speedup_vs_inductor']:.2f}x, {bf16['peak_gib']:.2f} GiB vs "
                f"{inductor['peak_gib']:.2f} GiB",
                "met": bf16["speedup_vs_inductor"] >= BF16_GOAL and bf16["peak_gib"] <= inductor["peak_gib"],
                "target_speedup": BF16_GOAL,
            }
        )
    for recipe in FP8_GOAL_RECIPES:
        if (fp8 := rows.get(f"primus_turbo fp8 {recipe}")) is not None:
            report.append(
                {
                    "goal": f"primus_turbo fp8 {recipe} >= {FP8_GOAL:.2f}x Inductor bf16",
                    "measured": f"{fp8['speedup_vs_inductor']:.2f}x",
                    "met": fp8["speedup_vs_inductor"] >= FP8_GOAL,
                    "target_speedup": FP8_GOAL,
                }
            )
    ours = [row for name, row in rows.items() if "primus_turbo" in name]
    if ours:
        slowest = max(ours, key=lambda row: row["compile_s"])
        ratio = slowest["compile_s"] / inductor["compile_s"]
        report.append(
            {
                "goal": f"compile time <= {COMPILE_GOAL:.2f}x Inductor's, every primus_turbo column",
                "measured": f"{ratio:.2f}x at most ({slowest['column']}: {slowest['compile_s']:.1f} s vs "
                f"{inductor['compile_s']:.1f} s)",
                "met": ratio <= COMPILE_GOAL,
            }
        )
    return report


def measure(step, x, device: str, kernels: int = 0, left_over: int = 0, cold: bool = True) -> dict:
    """A compile (the first step; ``cold``: with an empty Inductor cache), then the step's time (on a GPU also its
    kernel time and peak memory, less ``left_over`` bytes of earlier columns), output and input gradient; prints
    ``kernels`` kernels."""
    from torch._inductor.utils import fresh_inductor_cache

    start = time.perf_counter()
    with fresh_inductor_cache() if cold else contextlib.nullcontext():
        # Kept on the host: a column's outputs left on the GPU would count in the peak memory of every later column.
        out = step().detach().cpu()
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = {"ms": time_ms(step, device), "compile_s": compile_s, "out": out}
    result["grad"] = x.grad.detach().cpu() if x.grad is not None else None
    if device == "cuda":
        from benchmarks.common import kernel_us

        result["peak_gib"] = (torch.cuda.max_memory_allocated() - left_over) / 2**30
        per_kernel = sorted(kernel_us(step, steps=5).items(), key=lambda item: -item[1])
        result["gpu_ms"] = sum(us for _, us in per_kernel) / 1e3
        for kernel, us in per_kernel[:kernels]:
            print(f"    {us:9.1f} us  {kernel[:110]}")
    return result


def model_flops(model, config, batch: int, seq: int) -> float:
    """Training FLOPs of one step: 6 per token per matrix parameter, plus causal attention (fwd 2 matmuls, x3)."""
    matrix_params = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    matrix_params += getattr(config, "active_expert_parameters", 0)  # MoE: the experts a token is routed to
    head_dim = getattr(config, "head_dim", config.hidden // config.heads)
    attention = 3 * 4 * batch * config.heads * seq * seq * head_dim / 2 * config.layers
    return 6 * batch * seq * matrix_params + attention


# The printed table: header, row key, format; a column no row has is left out.
TABLE = (
    ("step ms", "step_ms", "{:9.3f}"),
    ("GPU ms", "gpu_ms", "{:8.3f}"),
    ("tokens/s", "tokens_per_s", "{:10.0f}"),
    ("TFLOP/s", "model_tflops", "{:8.1f}"),
    ("vs inductor", "speedup_vs_inductor", "{:11.2f}x"),
    ("peak GiB", "peak_gib", "{:9.2f}"),
    ("compile s", "compile_s", "{:10.1f}"),
    ("out SNR dB", "out_snr_db", "{:11.1f}"),
    ("dx SNR dB", "dx_snr_db", "{:10.1f}"),
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


def snr_db(out, ref) -> float:
    """10 log10(|ref|^2 / |out - ref|^2): the numerical difference to Inductor (inf when identical: null in JSON)."""
    noise = (out.double() - ref.double()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(ref.double().pow(2).sum().item() / noise)


if __name__ == "__main__":
    main()
