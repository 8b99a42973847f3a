"""The main job's workloads, as data: the hand-written Llama-style decoders and transformers' MoE decoders
(``--config``), transformers' own causal LMs (``--hf``), the sizes a run takes by default for each, and how each is
built into one step's work (``Workload``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from turbo_inductor.testing import hf
from turbo_inductor.testing.llama import CONFIGS as LLAMA_CONFIGS
from turbo_inductor.testing.llama import LlamaDecoder
from turbo_inductor.testing.moe import MOE_CONFIGS

# What ``python -m benchmarks.run_model`` runs with no model named: transformers' Llama-3-8B, at its published sizes
# on a GPU (2 layers, batch 2 x 2048, training), its tiny config on a CPU.
DEFAULT = ("hf", "llama3-8b")
BATCH = 2
CPU_SEQ = 64  # every family's default sequence on a CPU


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and one step's work on it: its input, the backward from its output, the gradients it compares, a
    title, and the model FLOPs of a training step. ``draw(k)`` writes input number k into ``inputs`` (0: the timed
    one). ``moe``: a ``--config`` MoE decoder (torchao's MoE training is its peer); ``hf``: transformers' causal LM (its
    loss or logits)."""

    base: torch.nn.Module
    inputs: torch.Tensor
    draw: Callable[[int], None]
    backward: Callable[[torch.Tensor], None]
    gradients: Callable[[torch.nn.Module], dict]
    title: str
    flops: float
    moe: bool = False
    hf: bool = False


def model_flops(matrix_params: int, layers: int, heads: int, head_dim: int, batch: int, seq: int) -> float:
    """Training FLOPs of one step: 6 per token per matrix parameter, plus causal attention (fwd 2 matmuls, x3)."""
    attention = 3 * 4 * batch * heads * seq * seq * head_dim / 2 * layers
    return 6 * batch * seq * matrix_params + attention


def _random_fill(tensor: torch.Tensor, fill: Callable[[torch.Generator], torch.Tensor]) -> Callable[[int], None]:
    """``draw(k)``: ``tensor`` overwritten with ``fill`` from a generator seeded with k; input 0 drawn now."""

    def draw(k: int) -> None:
        with torch.no_grad():
            tensor.copy_(fill(torch.Generator(tensor.device).manual_seed(k)))

    draw(0)
    return draw


def decoder_config(args, name: str, on_gpu: bool):
    """A ``--config`` model's shapes with the layer count asked for (one on a GPU by default, else its own)."""
    config = DECODERS.models[name]
    if args.layers or on_gpu:
        config = type(config)(**{**config.__dict__, "layers": args.layers or DECODERS.layers})
    return config


def decoder_workload(args, name: str, on_gpu: bool, device: str, dtype: torch.dtype) -> Workload:
    """A config's decoder on random hidden states; its backward takes a random cotangent; its gradient is dx."""
    config = decoder_config(args, name, on_gpu)
    moe = hasattr(config, "build")
    base = (config.build() if moe else LlamaDecoder(config)).to(device, dtype)
    x = torch.empty(args.batch, args.seq, config.hidden, device=device, dtype=dtype, requires_grad=args.mode == "train")
    cotangent = torch.randn_like(x)
    draw = _random_fill(x, lambda generator: torch.randn(x.shape, generator=generator, device=device))
    # MoE: the expert weights a token is routed to
    matrix = sum(p.numel() for p in base.parameters() if p.dim() == 2) + getattr(config, "active_expert_parameters", 0)
    head_dim = getattr(config, "head_dim", config.hidden // config.heads)
    return Workload(
        base,
        x,
        draw,
        lambda out: out.backward(cotangent.to(out.dtype)),
        lambda model: {"x": x.grad},
        f"{name} x{config.layers} layer(s)",
        model_flops(matrix, config.layers, config.heads, head_dim, args.batch, args.seq),
        moe,
    )


def hf_workload(args, name: str, on_gpu: bool, device: str, dtype: torch.dtype) -> Workload:
    """transformers' causal LM ``name`` on random input ids (tiny on CPU or with --tiny): its loss in training, else
    its logits; its gradients are the parameters'."""
    layers, train = args.layers or TRANSFORMERS.layers, args.mode == "train"
    with torch.device(device):  # random weights drawn on the GPU: a billion of them take a minute on the host
        lm = hf.build(name, layers, tiny=args.tiny, shrink=args.shrink)
    base = (hf.CausalLMLoss(lm) if train else hf.CausalLMLogits(lm)).to(device, dtype)
    config = lm.config
    input_ids = torch.empty(args.batch, args.seq, dtype=torch.long, device=device)
    vocab = config.vocab_size
    draw = _random_fill(input_ids, lambda g: torch.randint(0, vocab, input_ids.shape, generator=g, device=device))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return Workload(
        base,
        input_ids,
        draw,
        lambda loss: loss.backward(),
        lambda model: {key: p.grad for key, p in model.named_parameters() if p.grad is not None},
        f"{name} ({type(lm).__name__}{', tiny config' if args.tiny else ''}"
        f"{f', widths / {args.shrink}' if args.shrink > 1 else ''}) x{layers} layer(s) with the LM "
        f"head and {'loss' if train else 'logits'}",
        model_flops(hf.matrix_parameters(lm), layers, config.num_attention_heads, head_dim, args.batch, args.seq),
        hf=True,
    )


def decoder_description(args, name: str, on_gpu: bool) -> dict:
    """A ``--config`` model as the run's JSON records it: its config's fields."""
    return {**decoder_config(args, name, on_gpu).__dict__}


def hf_description(args, name: str, on_gpu: bool) -> dict:
    """A transformers model as the run's JSON records it: its class, config fields, layer count and whether it is
    the tiny variant."""
    fields = hf.config_fields(name, tiny=args.tiny, shrink=args.shrink)
    layers = args.layers or TRANSFORMERS.layers
    return {"class": hf.MODELS[name].model_class, **fields, "layers": layers, "tiny": args.tiny}


@dataclasses.dataclass(frozen=True)
class Family:
    """The workloads one option names: their shapes by name, the default sequence on a GPU (``CPU_SEQ`` on a CPU),
    the default layer count (a ``--config`` model on a CPU keeps its config's), how one is built and how the run's
    JSON describes it."""

    option: str
    models: dict
    gpu_seq: int
    layers: int
    build: Callable[..., Workload]
    describe: Callable[..., dict]

    def seq(self, on_gpu: bool) -> int:
        return self.gpu_seq if on_gpu else CPU_SEQ


# Llama-style decoders written here, and MoE decoders built from transformers' classes: one layer, 2 x 4096 on a GPU.
DECODERS = Family("--config", {**LLAMA_CONFIGS, **MOE_CONFIGS}, 4096, 1, decoder_workload, decoder_description)
# transformers' own causal LMs with their LM head: 2 layers, 2 x 2048 on a GPU (tiny configs on a CPU).
TRANSFORMERS = Family("--hf", hf.MODELS, 2048, 2, hf_workload, hf_description)
FAMILIES = {"config": DECODERS, "hf": TRANSFORMERS}
