"""Our Triton kernels compiled for Hopper (sm_90: H100, H200) on a machine without a GPU, as the GPU machine would
launch them: the launch heuristics' real configurations, Triton 3.x's own compiler and ptxas. What it tells without a
GPU: that a kernel compiles, its shared memory and registers, spills, how its main loop feeds the tensor cores, and
which arguments torch's analysis finds written (a compiled graph copies those before the launch).

Inside :func:`offline_hopper`, a launch of one of our kernels compiles it and runs nothing. The ops are called on
``meta`` tensors, so real sizes cost no memory. Nothing compiles under ``TRITON_INTERPRET=1``, which the tests set:
they call :func:`facts_in_a_process`, which runs this module as a program of its own.

    python -m turbo_inductor.testing.hopper [CASE...]   # a line of facts per kernel launch of each case
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import pkgutil
import re
import subprocess
import sys
import tempfile
import time

import torch

# An H100/H200 SXM: what the launch heuristics ask of the device. 227 KiB is the shared memory a block may opt into.
SMS = 132
MAX_SHARED = 232448


class _OfflineDriver:
    """Triton's view of an sm_90 GPU at device 0, for compiling only."""

    class utils:  # noqa: N801  (Triton's attribute name)
        @staticmethod
        def get_device_properties(index):
            return {"max_shared_mem": MAX_SHARED, "multiprocessor_count": SMS}

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("meta")


@dataclasses.dataclass
class Compiled:
    """One launch, compiled: the kernel's name, its launch's constexpr keywords and the compiler's outputs."""

    kernel: str
    constexprs: dict
    tensors: list[str]  # its tensor arguments
    writes: list[str]  # those torch's analysis finds written (a traced launch copies what is written)
    declared: list[str] | None  # those the kernel declares it writes (access_analysis.writes); None: no declaration
    analysis_ms: float  # that analysis's time on this host: a compile pays it per traced launch (access_analysis)
    descriptors: list[str]  # its tensor descriptor arguments (such a launch is never traced)
    ttgir: str
    ptx: str
    shared: int
    num_warps: int

    @functools.cached_property
    def ptxas(self) -> tuple[int, int, int]:
        """(registers per thread, bytes spilled, waits for MMAs that ptxas added) as ptxas reports them. ptxas adds a
        wait where registers an MMA writes are read before the kernel waited for it, serializing the MMAs."""
        from triton.backends.nvidia.compiler import get_ptxas

        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(self.ptx)
            f.flush()
            command = [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull]
            report = subprocess.run(command, capture_output=True, text=True, check=True).stderr
        registers = max(map(int, re.findall(r"Used (\d+) registers", report)), default=0)
        spilled = sum(map(int, re.findall(r"(\d+) bytes spill stores", report)))
        return (
            registers,
            spilled,
            len(re.findall(r"warpgroup\.wait is injected|wgmma\.mma_async instructions are serialized", report)),
        )

    def main_loop(self) -> str:
        """The TTGIR of the innermost loop issuing a tensor-core MMA (``warp_group_dot``); "" where none does."""
        lines = self.ttgir.splitlines()
        dots = [i for i, line in enumerate(lines) if "ttng.warp_group_dot " in line]
        if not dots:
            return ""

        def indent(i):
            return len(lines[i]) - len(lines[i].lstrip())

        start = next(i for i in range(dots[0], -1, -1) if "scf.for" in lines[i] and indent(i) < indent(dots[0]))
        end = next(i for i in range(start + 1, len(lines)) if indent(i) == indent(start))
        return "\n".join(lines[start : end + 1])

    def facts(self) -> dict:
        """What a test or a reader checks: resources, global accesses, and how the main loop feeds its MMAs.

        ``vector_loads``, ``vector_stores``, ``byte_stores``: global accesses in the PTX, 16 bytes or one at a time.
        ``mma_in_flight``: per wait in the main loop, the MMAs it leaves running (0: each one awaited before the next
        is issued). ``mma_waits_added``: waits ptxas put in where registers an MMA writes were read before the wait
        (it then awaits every MMA, whatever the TTGIR says). ``register_round_trips``: tiles the main loop writes from
        registers into shared memory, where an operand should arrive there straight from global memory."""
        registers, spilled, waits_added = self.ptxas
        loop = self.main_loop()
        return dict(
            kernel=self.kernel,
            tensors=self.tensors,
            writes=self.writes,
            declared=self.declared,
            analysis_ms=self.analysis_ms,
            descriptors=self.descriptors,
            shared=self.shared,
            num_warps=self.num_warps,
            registers=registers,
            spilled=spilled,
            # 16-byte global accesses: loads direct or pipelined into shared memory (cp.async), and stores
            vector_loads=len(re.findall(r"ld\.global\S*\.v4|cp\.async\S* \[[^]]*\], \[[^]]*\], 0x10", self.ptx)),
            vector_stores=len(re.findall(r"st\.global\S*\.v4", self.ptx)),
            byte_stores=len(re.findall(r"st\.global\.b8", self.ptx)),
            mma_in_flight=[int(n) for n in re.findall(r"warp_group_dot_wait .*pendings = (\d+)", loop)],
            mma_waits_added=waits_added,
            register_round_trips=loop.count("ttg.local_alloc %"),
            constexprs={k: v for k, v in self.constexprs.items() if isinstance(v, (bool, int, float, str))},
        )


def _written(kernel, arguments: dict) -> list[str]:
    """The tensor arguments torch's analysis of the kernel's TTIR finds written: what Inductor copies before a traced
    launch (every one where the analysis fails)."""
    from torch._higher_order_ops import triton_kernel_wrap

    # torch's own, not access_analysis's memory or declarations put in front of it
    if hasattr(triton_kernel_wrap, "identify_accessed_tensors"):  # torch >= 2.12
        analysis = inspect.unwrap(triton_kernel_wrap.identify_accessed_tensors)
        written = [dep.name for dep in analysis(kernel, arguments, {}).read_writes.writes]
    else:
        written = inspect.unwrap(triton_kernel_wrap.identify_mutated_tensors)(kernel, arguments, {})
    return sorted(name for name in written if isinstance(arguments.get(name), torch.Tensor))


@contextlib.contextmanager
def offline_hopper():
    """Within: launches of our Triton kernels compile for sm_90 and run nothing (their outputs stay unwritten);
    yields the list of :class:`Compiled` they append to."""
    from triton.runtime.driver import driver
    from triton.tools.tensor_descriptor import TensorDescriptor

    from ..kernels import triton as triton_kernels
    from ..kernels.triton import access_analysis

    if triton_kernels.interpreting():
        raise RuntimeError("nothing compiles under TRITON_INTERPRET=1: run in a process without it")
    compiled: list[Compiled] = []

    class Compile:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def compile_only(*args, **kwargs):
                kernel = self.kernel.warmup(*args, grid=grid, **kwargs)
                constexprs = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages")}
                arguments = dict(zip(self.kernel.arg_names, args)) | constexprs
                tensors = [name for name, value in arguments.items() if isinstance(value, torch.Tensor)]
                descriptors = [name for name, value in arguments.items() if isinstance(value, TensorDescriptor)]
                start = time.perf_counter()
                written = _written(self.kernel, arguments)
                analysis_ms = 1e3 * (time.perf_counter() - start)
                declared = access_analysis.declared(self.kernel, arguments)
                asm, metadata = kernel.asm, kernel.metadata
                name = self.kernel.fn.__name__
                compiled.append(
                    Compiled(
                        name,
                        constexprs,
                        tensors,
                        written,
                        sorted(declared) if declared is not None else None,
                        analysis_ms,
                        descriptors,
                        asm["ttgir"],
                        asm["ptx"],
                        metadata.shared,
                        metadata.num_warps,
                    )
                )

            return compile_only

    def limits(device):
        return triton_kernels.DeviceLimits(SMS, MAX_SHARED)

    # Every kernel module reads the two through the names it imported from the package.
    replaced = {"launch": Compile, "device_limits": limits}
    saved = []
    for info in pkgutil.iter_modules(triton_kernels.__path__):
        module = importlib.import_module(f"{triton_kernels.__name__}.{info.name}")
        for name, value in replaced.items():
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, value)
    # Without a GPU Triton has no driver to go back to: the one it had (None) is put back as it was.
    previous = driver._active
    driver.set_active(_OfflineDriver())
    try:
        yield compiled
    finally:
        driver.set_active(previous)
        for module, name, value in saved:
            setattr(module, name, value)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


E4M3 = torch.float8_e4m3fn


def _grouped_gemm(fast_accum: bool, E: int, S: int, K: int, N: int, block: int = 0, tma: bool = False):
    """The FP8 grouped GEMM (rows grouped) at [S, K] x E [N, K]: rowwise scales, or ``block`` (1 x block for a,
    block x block for b); ``tma``: loading through tensor descriptors."""
    from ..kernels.triton import grouped_mm

    a_scale = _meta(S, K // block if block else 1, dtype=torch.float32)
    b_scale = _meta(E, N // block if block else 1, K // block if block else 1, dtype=torch.float32)
    offs = _meta(E, dtype=torch.int32)
    gemm = grouped_mm.fp8_grouped_gemm_tma if tma else grouped_mm.fp8_grouped_gemm
    gemm(_meta(S, K, dtype=E4M3), a_scale, _meta(E, N, K, dtype=E4M3), b_scale, offs, torch.bfloat16, fast_accum)


def _grouped_wgrad(E: int, S: int, M: int, N: int, tma: bool = False):
    """The FP8 weight gradient: per group, [M, S] x [N, S]^T over the group's rows, scales per group and row."""
    from ..kernels.triton import grouped_mm

    a_scale, b_scale = _meta(E, M, 1, dtype=torch.float32), _meta(E, N, 1, dtype=torch.float32)
    wgrad = grouped_mm.fp8_grouped_gemm_wgrad_tma if tma else grouped_mm.fp8_grouped_gemm_wgrad
    wgrad(_meta(M, S, dtype=E4M3), a_scale, _meta(N, S, dtype=E4M3), b_scale, _meta(E, dtype=torch.int32),
          torch.bfloat16)  # fmt: skip


def _grouped_bf16(E: int, S: int, K: int, N: int):
    from ..kernels.triton import grouped_mm

    grouped_mm.grouped_gemm(_meta(S, K), _meta(E, K, N), _meta(E, dtype=torch.int32), torch.bfloat16)


def _dense_fp8_gemm(M: int, K: int, N: int, block: int):
    """The Triton FP8 GEMM (blockwise: 1 x block for a, block x block for b)."""
    from ..kernels.triton import fp8_gemm

    a_scale, b_scale = _meta(M, K // block, dtype=torch.float32), _meta(N // block, K // block, dtype=torch.float32)
    fp8_gemm.fp8_gemm(_meta(M, K, dtype=E4M3), a_scale, _meta(N, K, dtype=E4M3), b_scale, torch.bfloat16)


def _quantize_weight_both_layouts(E: int, N: int, K: int):
    """An expert weight [E, N, K] flattened to [E * N, K], quantized rowwise in both layouts, x^T's blocks one expert's
    rows long (``block_cols_t``): the row pass writing the column maxima at rows of 4096 and 14336, then x^T's cast."""
    from ..kernels.triton import fp8_quant

    fp8_quant.fp8_quantize(_meta(E * N, K), E4M3, 1, K, False, both_layouts=True, block_cols_t=N)


def _quantize_weight_once(E: int, N: int, K: int):
    """An expert weight [E, N, K] as ``weight_operands`` quantizes it for training: the forward's rows flattened to
    [E * N, K] in one pass, then that copy transposed for the dgrad."""
    from ..kernels.triton import fp8_quant, fp8_transpose

    fp8_quant.fp8_quantize(_meta(E * N, K), E4M3, 1, K, False)
    fp8_transpose.fp8_transpose(_meta(E, N, K, dtype=E4M3))


def _quantize_gradient_rows(E: int, S: int, C: int):
    """dy [S, C] by groups of rows, each row times its group's multiplier and quantized over the row (the dgrad's
    operand where W's scales lie along N), at C and at a row too wide for registers (walked twice)."""
    from ..kernels.triton import fp8_quant_grouped

    offs, wide = _meta(E, dtype=torch.int32), 65536
    fp8_quant_grouped.fp8_quantize_grouped_rows(_meta(S, C), offs, _meta(E, C), E4M3)
    fp8_quant_grouped.fp8_quantize_grouped_rows(_meta(S // 16, wide), offs, _meta(E, wide), E4M3)


def _quantize_grouped_transposed(E: int, S: int, C: int):
    """t [S, C] by groups of rows, transposed and quantized per group and column (the wgrad's operands)."""
    from ..kernels.triton import fp8_quant_grouped

    fp8_quant_grouped.fp8_quantize_grouped(_meta(S, C), _meta(E, dtype=torch.int32), E4M3, rowwise=True)


def _quantize_folded_wgrad_operands(E: int, S: int, T: int, narrow: int, wide: int):
    """The rowwise wgrad's operands where the wider one's FP8 rows are transposed: those bytes moved into the padded
    layout, and the narrower operand's rows (T tokens gathered into S rows) times the moved rows' scales, quantized per
    group and column."""
    from ..kernels.triton import fp8_quant_grouped, fp8_transpose

    offs = _meta(E, dtype=torch.int32)
    fp8_transpose.fp8_transpose_grouped(_meta(S, wide, dtype=E4M3), offs)
    rows, multiplier = _meta(S, dtype=torch.int64), _meta(S, dtype=torch.float32)
    fp8_quant_grouped.fp8_quantize_grouped(_meta(T, narrow), offs, E4M3, rows=rows, row_multiplier=multiplier)


def _triton(kernel: str):
    """The Triton implementation of ``kernel``, called directly (the registry would pick by device)."""
    from ..kernels import registry

    return registry.implementations(kernel)["triton"].fn


def _row_ops(T: int, H: int, inner: int):
    """The row kernels of a dense layer at T tokens, hidden H, intermediate ``inner``, training, bf16 (RMSNorm with its
    residual add, GLU, both writing FP8 copies, rotary)."""
    x, w, rstd = _meta(T, H), _meta(H), _meta(T, dtype=torch.float32)
    _triton("rmsnorm_fwd")(x, w, x, 1e-5)
    _triton("rmsnorm_fwd_fp8")(x, w, x, 1e-5, E4M3, H)
    _triton("rmsnorm_bwd")(x, x, w, rstd, x)
    gate = _meta(T, inner)
    _triton("glu_fwd")(gate, gate, None, None, "silu")
    _triton("glu_fwd_fp8")(gate, gate, None, None, "silu", E4M3, inner)
    _triton("glu_bwd")(gate, gate, gate, None, None, "silu", False)
    _triton("rotary")(_meta(2, 32, T // 2, 128), _meta(T // 2, 128), _meta(T // 2, 128), False)


def _wide_rows(T: int, H: int):
    """RMSNorm on rows too wide for registers (taken in chunks), forward and backward."""
    x, w = _meta(T, H), _meta(H)
    _triton("rmsnorm_fwd")(x, w, None, 1e-5)
    _triton("rmsnorm_bwd")(x, x, w, _meta(T, dtype=torch.float32), None)


def _row_options(T: int, H: int, inner: int, k: int):
    """The row kernels' other branches: the GLU backward with dup in dgate's buffer and the routing probabilities'
    gradient, the permute's gradient with its dots, RMSNorm on rows too wide for registers with its residual add."""
    gate = _meta(T, inner)
    _triton("glu_bwd")(gate, gate, gate, _meta(T, dtype=torch.float32), None, "silu", True)
    positions, weights = _meta(T, k, dtype=torch.int64), _meta(T, k, dtype=torch.float32)
    _triton("moe_dispatch")(_meta(T, H), positions, weights, _meta(T * k, H))
    wide = _meta(T // 8, 16 * H)
    _triton("rmsnorm_fwd")(wide, _meta(16 * H), wide, 1e-5)


def _loss_and_embedding(T: int, V: int, H: int):
    """The loss over a vocabulary of V at T tokens, and the embedding of hidden H: forward and backward."""
    logits, target, per_row = _meta(T, V), _meta(T, dtype=torch.int64), _meta(T, dtype=torch.float32)
    _triton("cross_entropy_fwd")(logits, target, -100)
    _triton("cross_entropy_bwd")(logits, target, per_row, per_row, -100)
    _triton("embedding_fwd")(_meta(V, H), target)
    _triton("embedding_bwd")(_meta(T, H), target, V, -1)


def _vendor_grouped_output_zeroed(S: int, N: int, E: int):
    """The zeros written past the last group under torch's grouped GEMMs, which leave those rows unwritten."""
    from ..kernels.triton import grouped_mm

    grouped_mm.zero_rows_past_groups(_meta(S, N), _meta(E, dtype=torch.int32))


def _routing(T: int, k: int, E: int, H: int):
    """MoE routing of T tokens to k of E experts, hidden H: the permute (bf16 and FP8), its gradient's sum."""
    indices, weights = _meta(T, k, dtype=torch.int64), _meta(T, k, dtype=torch.float32)
    _triton("moe_route")(indices, E)
    positions = _meta(T, k, dtype=torch.int64)
    _triton("moe_dispatch")(_meta(T, H), positions, weights)
    _triton("moe_dispatch_fp8")(_meta(T, H), positions, E4M3, H)
    _triton("moe_gather_sum")(_meta(T * k, H), positions, weights, torch.bfloat16)


# Each case: the launches of one call at the sizes the benchmarks run (Mixtral-8x7B's and Qwen3-30B-A3B's experts at
# 2 x 4096 tokens, Llama-3-8B's linears).
CASES = {
    "grouped_fwd": lambda: _grouped_gemm(True, 8, 16384, 4096, 28672),
    "grouped_dgrad": lambda: _grouped_gemm(False, 8, 16384, 28672, 4096),
    "grouped_blockwise": lambda: _grouped_gemm(False, 8, 16384, 4096, 28672, block=128),
    "grouped_wgrad": lambda: _grouped_wgrad(8, 16384, 4096, 28672),
    "grouped_fwd_tma": lambda: _grouped_gemm(True, 8, 16384, 4096, 28672, tma=True),
    "grouped_dgrad_tma": lambda: _grouped_gemm(False, 8, 16384, 28672, 4096, tma=True),
    "grouped_wgrad_tma": lambda: _grouped_wgrad(8, 16384, 4096, 28672, tma=True),
    "grouped_bf16": lambda: _grouped_bf16(8, 16384, 4096, 28672),
    "qwen3_grouped_fwd": lambda: _grouped_gemm(True, 128, 65536, 2048, 1536),
    "qwen3_grouped_wgrad": lambda: _grouped_wgrad(128, 65536, 2048, 1536),
    "dense_blockwise": lambda: _dense_fp8_gemm(8192, 4096, 14336, 128),
    "gate_up_weight": lambda: _quantize_weight_both_layouts(8, 28672, 4096),
    "down_weight": lambda: _quantize_weight_both_layouts(8, 4096, 14336),
    "grouped_transposed": lambda: _quantize_grouped_transposed(8, 16384, 4096),
    "folded_wgrad_operands": lambda: _quantize_folded_wgrad_operands(8, 16384, 8192, 4096, 28672),
    "gate_up_weight_once": lambda: _quantize_weight_once(8, 28672, 4096),
    "gate_up_gradient_rows": lambda: _quantize_gradient_rows(8, 16384, 28672),
    "down_gradient_rows": lambda: _quantize_gradient_rows(8, 16384, 4096),
    "llama_rows": lambda: _row_ops(8192, 4096, 14336),
    "row_options": lambda: _row_options(8192, 4096, 14336, 2),
    "loss_and_embedding": lambda: _loss_and_embedding(8192, 128256, 4096),
    "mixtral_routing": lambda: _routing(8192, 2, 8, 4096),
    "wide_rows": lambda: _wide_rows(1024, 65536),
    "rows_past_groups": lambda: _vendor_grouped_output_zeroed(16384, 28672, 8),
}


def launched_kernels() -> set[str]:
    """The kernels the Triton implementations launch (``launch(kernel)`` in their sources): what the cases cover."""
    from ..kernels import triton as triton_kernels

    names = set()
    for info in pkgutil.iter_modules(triton_kernels.__path__):
        source = pathlib.Path(importlib.util.find_spec(f"{triton_kernels.__name__}.{info.name}").origin).read_text()
        names |= set(re.findall(r"launch\((_\w+_kernel)\)", source))
    return names


def facts(cases) -> list[dict]:
    """The facts of every launch of each case, in order."""
    out = []
    with offline_hopper() as compiled:
        for case in cases:
            start = len(compiled)
            CASES[case]()
            out += [dict(case=case, **c.facts()) for c in compiled[start:]]
    return out


def facts_in_a_process(*cases: str, timeout: float = 600) -> list[dict]:
    """:func:`facts` from a process without ``TRITON_INTERPRET``, for tests (which run under it). A Triton without its
    NVIDIA backend (ROCm's) cannot compile for sm_90: the test is skipped."""
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        import pytest

        pytest.skip("this Triton has no NVIDIA backend to compile for sm_90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", __name__, "--json", *cases], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"compiling for sm_90 failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    as_json = "--json" in argv
    cases = [a for a in argv if a != "--json"] or list(CASES)
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown case(s) {sorted(unknown)}; choose from {sorted(CASES)}")
    rows = facts(cases)
    if as_json:
        print(json.dumps(rows))
        return
    for row in rows:
        print(
            f"{row['case']:22} {row['kernel']:30} shared {row['shared']:6} B  warps {row['num_warps']:2}  "
            f"registers {row['registers']:3}  spilled {row['spilled']:4} B  MMAs in flight {row['mma_in_flight']}  "
            f"waits added {row['mma_waits_added']}  register round trips {row['register_round_trips']}  "
            f"16-byte loads {row['vector_loads']} stores {row['vector_stores']}  byte stores {row['byte_stores']}  "
            f"torch's analysis {row['analysis_ms']:.0f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
