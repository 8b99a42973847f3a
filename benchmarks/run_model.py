"""The main job: a Llama-style decoder's training step (or inference forward) under eager, Inductor and primus_turbo
(bf16, FP8 recipes, torchao's float8 beside them): step time, speedup, memory, compile time, SNR against Inductor.
MoE configs (mixtral-8x7b, qwen3-30b-a3b) build transformers' MoE decoders, with torchao's MoE training beside them.
With --hf: transformers' own causal LMs at published sizes, LM head and loss included (on CPU: tiny configs), with
Liger-Kernel's kernels patched into them beside ours.
``python -m benchmarks.run_model [--config llama3-8b[,...] | --hf llama3-8b[,...]] [--fp8 tensorwise,rowwise]
[--mode train|inference]``"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import importlib.util
import json
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch

import turbo_inductor
from benchmarks import goals, record, report
from turbo_inductor.testing import hf, scaled_mm_takes_row_scales
from turbo_inductor.testing.llama import CONFIGS as LLAMA_CONFIGS
from turbo_inductor.testing.llama import LlamaDecoder
from turbo_inductor.testing.moe import MOE_CONFIGS

# Llama-style decoders, and MoE decoders built from transformers' classes (their configs build them)
CONFIGS = {**LLAMA_CONFIGS, **MOE_CONFIGS}

# FP8 recipes torchao has under the same names (a torchao column is added for each one requested), and those whose
# torchao configs primus_turbo runs on its own fp8_linear (a column of the torchao model compiled by primus_turbo).
TORCHAO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
TORCHAO_ON_OURS = ("tensorwise", "rowwise")


def torchao_recipes(recipes, device: str, known) -> list[str]:
    """Those of ``recipes`` (of ``known``) torchao runs on ``device``: none without torchao, and its rowwise ones
    only where ``torch._scaled_mm`` takes per-row scales."""
    if importlib.util.find_spec("torchao") is None:
        return []
    return [r for r in recipes if r in known and (r == "tensorwise" or scaled_mm_takes_row_scales(device))]


# The FP8 recipes a GPU run measures unless --fp8 says otherwise: those with goals on every model (goals.py).
DEFAULT_FP8 = ("tensorwise", "rowwise")
CPU_NOTE = "On CPU: timings are CPU wall-clock times, not GPU figures; GPU time, memory and goals are GPU-only."


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


def main(argv=None):
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument(
        "--config",
        default=None,
        help=f"model shapes, comma-separated, from {sorted(CONFIGS)} (default: {'llama3-8b' if on_gpu else 'tiny'})",
    )
    parser.add_argument(
        "--hf",
        default=None,
        help=f"transformers' own causal LMs instead, comma-separated, from {sorted(hf.MODELS)}: published sizes "
        "(tiny on CPU), LM head and loss included",
    )
    parser.add_argument("--tiny", action="store_true", help="with --hf: each family's tiny config, as on a CPU")
    parser.add_argument(
        "--layers", type=int, default=None, help="default: 2 with --hf, else 1 on GPU and the config's on CPU"
    )
    parser.add_argument("--batch", type=int, default=2)
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
        "--snr-inputs",
        type=int,
        default=4,
        help="SNRs pooled over this many random inputs (signal and noise summed over them): one input's worst "
        "gradient SNR moves by ~0.1 dB between two compiles of the same arithmetic",
    )
    parser.add_argument(
        "--kernels", type=int, default=0, help="GPU: print the N kernels taking most GPU time per column"
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
    args = parser.parse_args(argv)
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
    if args.hf is not None and args.config is not None:
        parser.error("--config and --hf: give one of them")
    if args.tiny and args.hf is None:
        parser.error("--tiny goes with --hf (the tiny decoder is --config tiny)")
    args.tiny = args.tiny or not on_gpu  # a CPU runs the tiny configs
    # the options this run's file is named by, before the defaults that depend on the model are filled in
    ignore = {"config", "hf", "tiny", "mode", "fp8", "out", "kernels", "warm_compile"}
    named_options = record.changed_options(parser, args, ignore=ignore)
    if args.hf is not None:
        option, asked, choices = "--hf", args.hf, sorted(hf.MODELS)
    else:
        option, asked, choices = "--config", args.config or ("llama3-8b" if on_gpu else "tiny"), sorted(CONFIGS)
    names = [name for name in asked.split(",") if name]
    unknown = [name for name in names if name not in choices]
    if unknown or not names:
        parser.error(f"{option}: unknown model {unknown or asked!r}; choose from {choices}")
    if args.seq is None:
        args.seq = 64 if not on_gpu else 2048 if args.hf else 4096
    if args.hf is None:
        args.config = ",".join(names)  # the configuration records the models that ran
    configuration = {
        **{key: value for key, value in vars(args).items() if key not in ("out", "kernels")},
        "models": {name: model_description(args, name, on_gpu) for name in names},
    }
    recipes = [recipe for recipe in args.fp8.split(",") if recipe]
    parts = ["hf" if args.hf else "", "-".join(names), args.mode, f"fp8-{'-'.join(recipes)}" if recipes else ""]
    parts += named_options
    if not on_gpu:
        print(CPU_NOTE)
    rows, goal_lines = [], []
    with torch._inductor.config.patch(freezing=args.freezing):  # global: Dynamo reads it, an option would not reach it
        for name in names:
            table = run_config(args, name, on_gpu)
            rows += table
            if on_gpu:
                goal_lines += [{"model": name, **line} for line in goals.evaluate(table, configuration, name)]
            # written after each model: a run stopped by a time limit keeps the models it finished
            extra = {"goals": goal_lines} if on_gpu else {}
            path = record.write("model", parts, configuration, rows, args.out, **extra)
    for line in goal_lines:
        print(f"goal: {line['model']}: {line['goal']}: {line['measured']} -> {'met' if line['met'] else 'MISSED'}")
    for name in names:  # GPU figures: a CPU run records no peak memory
        for line in goals.lighter_peers([row for row in rows if row["model"] == name]):
            print(f"peak memory: {name}: {line}")
    report.write_chart(path)


def model_config(args, model_name: str, on_gpu: bool):
    """The model's shapes, with the layer count asked for (one on a GPU by default)."""
    config = CONFIGS[model_name]
    if args.layers or on_gpu:
        config = type(config)(**{**config.__dict__, "layers": args.layers or 1})
    return config


def model_description(args, model_name: str, on_gpu: bool) -> dict:
    """The model's shapes as the run's JSON records them: a config's fields, or a transformers model's config
    fields, its class, layer count and whether it is the tiny variant."""
    if not args.hf:
        return {**model_config(args, model_name, on_gpu).__dict__}
    fields = hf.config_fields(model_name, tiny=args.tiny)
    return {"class": hf.MODELS[model_name].model_class, **fields, "layers": args.layers or 2, "tiny": args.tiny}


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and one step's work on it: its input, the backward from its output, the gradients it compares, a
    title, and the model FLOPs of a training step. ``draw(k)`` writes input number k into ``inputs`` (0: the timed
    one)."""

    base: torch.nn.Module
    inputs: torch.Tensor
    draw: Callable[[int], None]
    backward: Callable[[torch.Tensor], None]
    gradients: Callable[[torch.nn.Module], dict]
    title: str
    flops: float
    moe: bool = False


def decoder_workload(args, model_name: str, on_gpu: bool, device: str, dtype: torch.dtype) -> Workload:
    """A config's decoder on random hidden states; its backward takes a random cotangent; its gradient is dx."""
    config = model_config(args, model_name, on_gpu)
    moe = hasattr(config, "build")
    base = (config.build() if moe else LlamaDecoder(config)).to(device, dtype)
    x = torch.empty(args.batch, args.seq, config.hidden, device=device, dtype=dtype, requires_grad=args.mode == "train")
    cotangent = torch.randn_like(x)

    def draw(k: int) -> None:
        with torch.no_grad():
            x.copy_(torch.randn(x.shape, generator=torch.Generator(device).manual_seed(k), device=device))

    draw(0)
    # MoE: the expert weights a token is routed to
    matrix = sum(p.numel() for p in base.parameters() if p.dim() == 2) + getattr(config, "active_expert_parameters", 0)
    head_dim = getattr(config, "head_dim", config.hidden // config.heads)
    return Workload(
        base,
        x,
        draw,
        lambda out: out.backward(cotangent.to(out.dtype)),
        lambda model: {"x": x.grad},
        f"{model_name} x{config.layers} layer(s)",
        model_flops(matrix, config.layers, config.heads, head_dim, args.batch, args.seq),
        moe,
    )


def hf_workload(args, model_name: str, on_gpu: bool, device: str, dtype: torch.dtype) -> Workload:
    """transformers' causal LM ``model_name`` on random input ids (tiny on CPU or with --tiny): its loss in
    training, else its logits; its gradients are the parameters'."""
    layers, train = args.layers or 2, args.mode == "train"
    with torch.device(device):  # random weights drawn on the GPU: a billion of them take a minute on the host
        lm = hf.build(model_name, layers, tiny=args.tiny)
    base = (hf.CausalLMLoss(lm) if train else hf.CausalLMLogits(lm)).to(device, dtype)
    config = lm.config
    input_ids = torch.empty(args.batch, args.seq, dtype=torch.long, device=device)

    def draw(k: int) -> None:
        generator = torch.Generator(device).manual_seed(k)
        input_ids.copy_(torch.randint(0, config.vocab_size, input_ids.shape, generator=generator, device=device))

    draw(0)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return Workload(
        base,
        input_ids,
        draw,
        lambda loss: loss.backward(),
        lambda model: {name: p.grad for name, p in model.named_parameters() if p.grad is not None},
        f"{model_name} ({type(lm).__name__}{', tiny config' if args.tiny else ''}) x{layers} layer(s) with the LM "
        f"head and {'loss' if train else 'logits'}",
        model_flops(hf.matrix_parameters(lm), layers, config.num_attention_heads, head_dim, args.batch, args.seq),
    )


def run_config(args, model_name: str, on_gpu: bool) -> list[dict]:
    """Every column on the model ``model_name``: its rows of the table, printed."""
    device, dtype = ("cuda" if on_gpu else "cpu"), getattr(torch, args.dtype)
    autocast_dtype, dtype = (dtype, torch.float32) if args.autocast else (None, dtype)
    train = args.mode == "train"
    torch.manual_seed(0)
    work = (hf_workload if args.hf else decoder_workload)(args, model_name, on_gpu, device, dtype)
    base, inputs, moe = work.base, work.inputs, work.moe
    if args.frozen_linears:
        for module in base.modules():
            if isinstance(module, torch.nn.Linear):
                module.requires_grad_(False)
    print(f"{work.title}, batch {args.batch} x seq {args.seq}, {args.dtype}, {device}, {_step_kind(args)}")

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
    elif not moe:
        columns += [
            (f"torchao fp8 {recipe}", "inductor", {"torchao": recipe})
            for recipe in torchao_recipes(recipes, device, TORCHAO_RECIPES)
        ]
        columns += [
            (f"torchao fp8 {recipe} on primus_turbo", "primus_turbo", {"torchao": recipe})
            for recipe in torchao_recipes(recipes, device, TORCHAO_ON_OURS)
        ]
    # Liger-Kernel's Triton kernels patched into transformers' model (the kernel library a user would pick instead)
    # compiled by Inductor, and compiled by primus_turbo: whether the two compose
    if args.hf and liger_patches(base.model):
        columns += [("liger", "inductor", {"liger": True}), ("liger on primus_turbo", "primus_turbo", {"liger": True})]
    results, waiting, reference = {}, {}, None  # waiting: columns' outputs and gradients, until Inductor's are there
    from tqdm import tqdm  # comes with transformers; the progress of minutes-long compiles and measurements

    if on_gpu:  # a CPU's compile times are no goal
        warm_up_compiler(device)
    progress = tqdm(columns, desc="columns", unit="column")
    allocated_before = torch.cuda.memory_allocated() if on_gpu else 0
    for name, backend, options in progress:
        progress.set_description(f"compiling and timing {name}")
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        # What earlier columns left allocated is no part of this one's peak: a frozen graph's constants (W's FP8
        # copy) stay in its generated module, which Inductor keeps loaded (sys.modules) after torch._dynamo.reset().
        # The last column's model and input gradient go first: freed in this column, they would be taken off twice.
        model = run = inputs.grad = None
        gc.collect()
        left_over = torch.cuda.memory_allocated() - allocated_before if on_gpu else 0
        model = copy.deepcopy(base)

        def step():
            with torch.autocast(device, autocast_dtype, enabled=autocast_dtype is not None):
                if not train:
                    with torch.no_grad():
                        return run(inputs)
                inputs.grad = None
                model.zero_grad(set_to_none=True)
                out = run(inputs)
            work.backward(out)
            return out

        def gradients():
            return work.gradients(model)

        def measured():
            return measure(
                step, gradients, device, args.kernels, left_over, not args.warm_compile, args.compile_kernels
            )

        with contextlib.ExitStack() as patches:  # what a peer patches outside its model holds for its column alone
            try:
                run = for_column(model, backend, options, args.dynamic, patches)
                try:
                    results[name] = measured()
                except Exception:
                    if not (options and "torchao_moe" in options):
                        raise
                    # torchao's compiled MoE training fails on Hopper (ao#4048): measured eagerly, as the column says
                    run, name = model, f"{name} (eager: compile failed)"
                    results[name] = measured()
            except Exception as error:  # a column that fails is reported, the others still run
                cause = getattr(error, "inner_exception", None) or error  # Dynamo wraps backend errors
                results[name] = {"error": f"{type(cause).__name__}: {str(cause).strip()[:160]}"}
                continue
            if backend == "primus_turbo":
                results[name]["rewrites"] = turbo_inductor.rewrite_counts()
                print(f"{name} fused:", results[name]["rewrites"])
            waiting[name] = {"out": [results[name].pop("out")], "grads": [results[name].pop("grads")]}
            for k in range(1, args.snr_inputs):  # more inputs for the SNRs, then the timed one back for the next column
                work.draw(k)
                waiting[name]["out"].append(step().detach())
                waiting[name]["grads"].append({p: g.detach() for p, g in gradients().items() if g is not None})
            work.draw(0)
        if name == "inductor":
            reference = waiting[name]
        if reference is not None:  # compared on the device, and freed: no column's tensors stay in later ones' peak
            for column in list(waiting):
                results[column]["accuracy"] = accuracy(waiting.pop(column), reference, bool(args.hf), train)

    ref = results["inductor"]
    tokens = args.batch * args.seq
    flops = work.flops / (1 if train else 3)  # forward: a third
    table = []
    for name, r in results.items():
        if "error" in r:
            table.append({"model": model_name, "column": name, "error": r["error"]})
            continue
        # What this machine cannot measure is left out: GPU time and peak memory on CPU, gradients in inference.
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
                "compile_phases": r["compile_phases"],
                **({"triton_compiles": r["triton_compiles"]} if "triton_compiles" in r else {}),
                **r["accuracy"],
                "rewrites": r.get("rewrites", {}),
            }
        )
    print_table(table)
    return table


def for_column(model, backend: str, options: dict | None, dynamic, patches: contextlib.ExitStack):
    """``model`` as its column runs it: converted for a peer (torchao's float8 or MoE training, Liger's kernels), then
    compiled by ``backend`` (eager: as it is). A peer's patches outside the model last as long as ``patches``."""
    if options and "torchao" in options:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(options["torchao"]))
    elif options and "torchao_moe" in options:
        from torchao.prototype.moe_training.config import Float8TrainingOpConfig
        from torchao.quantization import quantize_

        quantize_(model, Float8TrainingOpConfig(), filter_fn=lambda module, fqn: fqn.endswith("experts"))
    elif options and "liger" in options:
        patches.enter_context(liger_applied(model.model))
    else:
        return model if backend == "eager" else torch.compile(model, backend=backend, options=options, dynamic=dynamic)
    return torch.compile(model, backend=backend, dynamic=dynamic)  # a peer's model, with no options of ours


def liger_patches(lm) -> bool:
    """Whether Liger-Kernel is installed and patches transformers models of ``lm``'s type; True where it fails to
    import, so that its column reports the failure."""
    if importlib.util.find_spec("liger_kernel") is None:
        return False
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except Exception:  # imported again when its column is built, which then reports the error
        return True
    return lm.config.model_type in MODEL_TYPE_TO_APPLY_LIGER_FN


@contextlib.contextmanager
def liger_applied(lm):
    """Liger-Kernel's kernels in transformers' model ``lm``, applied as its README applies them to a model already
    built (``_apply_liger_kernel_to_instance``), for the block. Liger also replaces the classes and the rotary function
    in the family's modeling module, which every other model of the family calls: the module is restored on leaving."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    module = vars(sys.modules[type(lm).__module__])
    saved = dict(module)
    try:
        _apply_liger_kernel_to_instance(model=lm)
        yield
    finally:
        for added in module.keys() - saved.keys():
            del module[added]
        module.update(saved)


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
    start = time.perf_counter()
    with (
        fresh_inductor_cache() if cold else contextlib.nullcontext(),
        triton_compiles(compiles) if compile_kernels else contextlib.nullcontext(),
    ):
        out = step().detach()
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    phases = compile_phases(timers, compile_s)
    compiled = any(s for phase, s in phases.items() if phase != "other")  # not the eager column
    if compiled:
        print("    compile", ", ".join(f"{phase} {s:.1f} s" for phase, s in phases.items()))
    result = {"ms": time_ms(step, device), "compile_s": compile_s, "compile_phases": phases, "out": out}
    if compile_kernels and compiled:
        compiles.sort(key=lambda kernel: -kernel[1])
        result["triton_compiles"] = {"kernels": len(compiles), "seconds": sum(s for _, s in compiles)}
        print(f"    Triton compiles: {len(compiles)} kernels, {result['triton_compiles']['seconds']:.1f} s")
        for name, s in compiles[:compile_kernels]:
            print(f"    {s:7.2f} s  {name[:110]}")
    if device == "cuda":
        from benchmarks.common import kernel_us

        # One step's peak, on its own: do_bench's 256 MiB cache-flushing buffer is allocated during its timed steps.
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        result["peak_gib"] = (torch.cuda.max_memory_allocated() - left_over) / 2**30
        per_kernel = sorted(kernel_us(step, steps=5).items(), key=lambda item: -item[1])
        result["gpu_ms"] = sum(us for _, us in per_kernel) / 1e3
        for kernel, us in per_kernel[:kernels]:
            print(f"    {us:9.1f} us  {kernel[:110]}")
    result["grads"] = {name: grad.detach() for name, grad in gradients().items() if grad is not None}
    return result


# A compile's phases: torch's own timers, and ours for the passes. What none of them covers (AOTAutograd's tracing,
# the scheduler, guards, the first run) is "other".
COMPILE_TIMERS = {
    "dynamo": "bytecode_tracing",
    "lowering": "GraphLowering.run",
    "codegen": "GraphLowering.codegen",
    "triton wait": "async_compile.wait",  # Triton kernels compiling in Inductor's worker processes
}


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


def model_flops(matrix_params: int, layers: int, heads: int, head_dim: int, batch: int, seq: int) -> float:
    """Training FLOPs of one step: 6 per token per matrix parameter, plus causal attention (fwd 2 matmuls, x3)."""
    attention = 3 * 4 * batch * heads * seq * seq * head_dim / 2 * layers
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


def snr_db(outs: list, refs: list) -> float:
    """10 log10(sum |ref|^2 / sum |out - ref|^2) over pairs of tensors: the numerical difference to Inductor (inf
    when identical: null in JSON)."""
    noise = sum((out.double() - ref.double()).pow(2).sum().item() for out, ref in zip(outs, refs, strict=True))
    signal = sum(ref.double().pow(2).sum().item() for ref in refs)
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


if __name__ == "__main__":
    main()
