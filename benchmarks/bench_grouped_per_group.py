"""The MoE experts' GEMMs two ways, pass by pass: torch's grouped kernels (CUTLASS: ``torch._grouped_mm``,
``torch._scaled_grouped_mm``) against one cuBLAS GEMM per group after offs is read on the host (a sync), as
TransformerEngine's GroupedLinear does with its host-side splits. bf16 and FP8 rowwise (fast accumulation or not), the
forward, dgrad and wgrad, at bench_grouped_mm's shapes and routing, each group padded to 16 rows (cuBLASLt's FP8 GEMMs
take no other). The per-group time includes the sync and the launches after it.
python -m benchmarks.bench_grouped_per_group [--configs mixtral-8x7b,qwen3-30b-a3b] [--tokens N]
Prints a table and writes grouped_per_group.json (benchmarks/record.py). Why: docs/kernels.md, "Grouped GEMM"."""

from __future__ import annotations

import argparse

import torch

from benchmarks import record
from benchmarks.bench_grouped_mm import CONFIGS, DEVICE, TOKENS, projections, routing
from benchmarks.common import bench_ms
from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference.grouped_mm import group_bounds

PAD = 16


def padded(offs: torch.Tensor) -> torch.Tensor:
    """offs with each group's rows rounded up to a multiple of PAD."""
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    return torch.cumsum((counts + PAD - 1) // PAD * PAD, 0).to(torch.int32)


def rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t [R, C] quantized to e4m3 by the package's kernel, a scale per row (fp32 [R, 1])."""
    return registry.select("fp8_quantize", t.device)(t, torch.float8_e4m3fn, 1, t.shape[1], False)


def per_group(offs: torch.Tensor, rows: int, gemm) -> None:
    """``gemm(g, start, end)`` for every non-empty group of ``rows`` rows, after reading offs on the host."""
    for g, (start, end) in enumerate(group_bounds(offs, rows)):
        if end > start:
            gemm(g, start, end)


def passes(s: int, k: int, n: int, groups: int, offs: torch.Tensor) -> dict[str, tuple]:
    """Pass -> (torch's grouped call, the per-group loop), on random operands: y [S, N] = x [S, K] W[g] with the
    parameter [E, N, K]; dx = dy W[g]^T; dW[g] = dy^T x over the group's rows."""
    x = torch.randn(s, k, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(groups, n, k, device=DEVICE, dtype=torch.bfloat16) / k**0.5
    dy = torch.randn(s, n, device=DEVICE, dtype=torch.bfloat16)
    y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)

    def mm(out, a, b):
        return lambda g, i, j: torch.mm(a(g, i, j), b(g, i, j), out=out(g, i, j))

    cases = {
        "bf16 forward": (
            lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
            mm(lambda g, i, j: y[i:j], lambda g, i, j: x[i:j], lambda g, i, j: w[g].t()),
        ),
        "bf16 dgrad": (
            lambda: torch._grouped_mm(dy, w, offs=offs),
            mm(lambda g, i, j: dx[i:j], lambda g, i, j: dy[i:j], lambda g, i, j: w[g]),
        ),
        "bf16 wgrad": (
            lambda: torch._grouped_mm(dy.t(), x, offs=offs),
            mm(lambda g, i, j: dw[g], lambda g, i, j: dy[i:j].t(), lambda g, i, j: x[i:j]),
        ),
    }
    xq, xs = rowwise(x)
    wq, ws = (t.view(groups, n, -1) for t in rowwise(w.view(groups * n, k)))  # a scale per expert and output column
    # The wgrad's operands transposed, [N, S] and [K, S], scaled per row: the padded layout the FP8 wgrads take.
    dytq, dyts = rowwise(dy.t().contiguous())
    xtq, xts = rowwise(x.t().contiguous())
    scale_w = ws.reshape(groups, n).contiguous()
    # torch's grouped wgrad takes a scale per group and row of each operand, flattened
    scales_t = (dyts.reshape(1, n).expand(groups, n).reshape(-1), xts.reshape(1, k).expand(groups, k).reshape(-1))
    for fast in (False, True):

        def forward(g, i, j, fast=fast):
            y[i:j] = torch._scaled_mm(
                xq[i:j], wq[g].t(), xs[i:j], ws[g].reshape(1, n), out_dtype=torch.bfloat16, use_fast_accum=fast
            )

        def wgrad(g, i, j, fast=fast):
            dw[g] = torch._scaled_mm(
                dytq[:, i:j], xtq[:, i:j].t(), dyts, xts.reshape(1, k), out_dtype=torch.bfloat16, use_fast_accum=fast
            )

        cases[f"fp8 forward fast_accum={fast}"] = (
            lambda fast=fast: torch._scaled_grouped_mm(
                xq,
                wq.transpose(-2, -1),
                xs.reshape(-1),
                scale_w,
                offs=offs,
                out_dtype=torch.bfloat16,
                use_fast_accum=fast,
            ),
            forward,
        )
        cases[f"fp8 wgrad fast_accum={fast}"] = (
            lambda fast=fast: torch._scaled_grouped_mm(
                dytq,
                xtq.t(),
                *scales_t,
                offs=offs,
                out_dtype=torch.bfloat16,
                use_fast_accum=fast,
            ),
            wgrad,
        )
    return cases


def run(configs: list[str], tokens: int) -> list[dict]:
    rows = []
    for config in configs:
        groups, top_k = CONFIGS[config][:2]
        offs = padded(routing(tokens, groups, top_k))
        s = int(offs[-1])
        for projection, (k, n) in projections(config).items():
            tflop = 2 * s * k * n / 1e12
            for name, (grouped, loop) in passes(s, k, n, groups, offs).items():
                grouped_ms = bench_ms(grouped)
                loop_ms = bench_ms(lambda loop=loop: per_group(offs, s, loop))
                rows.append(
                    {
                        "shape": f"{config} {projection} [{s}, {k}] x [{groups}, {k}, {n}]",
                        "pass": name,
                        "grouped_ms": grouped_ms,
                        "per_group_ms": loop_ms,
                        "grouped_tflops": tflop / grouped_ms * 1e3,
                        "per_group_tflops": tflop / loop_ms * 1e3,
                        "per_group_vs_grouped": grouped_ms / loop_ms,
                    }
                )
                r = rows[-1]
                print(
                    f"{r['shape']:48s} {name:26s} grouped {grouped_ms:7.3f} ms, per group {loop_ms:7.3f} ms: "
                    f"{r['per_group_vs_grouped']:.2f}x",
                    flush=True,
                )
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--tokens", type=int, default=TOKENS // 2, help="tokens routed (run_model's MoE step: 4096)")
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    args = parser.parse_args()
    rows = run(args.configs.split(","), args.tokens)
    record.write("grouped_per_group", record.changed_options(parser, args, ignore={"out"}), vars(args), rows, args.out)


if __name__ == "__main__":
    main()
