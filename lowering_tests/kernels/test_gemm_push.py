"""impl="push" of gemm_allreduce_fwd: the persistent GEMM that pushes its tiles into the peer's symmetric memory
(``kernels/symm_mem/gemm_push.py``). On CPU its kernel runs in Triton's interpreter, one process per rank sharing
their buffers; on two GPUs (NCCL, symmetric memory) the op, the row-parallel rewrite and the column-parallel
backward run it and match GEMM then all-reduce and Inductor."""

import dataclasses
import re
import time

import pytest
import torch
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
import triton
from torch._inductor.utils import run_and_get_code

import turbo_inductor
from turbo_inductor.kernels import registry
from turbo_inductor.kernels.symm_mem import gemm_push
from turbo_inductor.testing.distributed import WORLD, ColumnParallel, RowParallel, init, run_step, spawn

PUSH = {"impl": "gemm_allreduce_fwd=push"}
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason="symmetric memory: one GPU per rank")


# ---- the kernel in the interpreter: two processes, each one program (the interpreter runs a grid's programs one
# after another, so a program waiting on a later one of its own grid would never return) -----------------------


@dataclasses.dataclass
class InterpretedCase:
    """One shape for both ranks: inputs, the buffers the ranks share, and each call's output on each rank."""

    w_kn: bool
    M: int
    N: int
    tile: tuple
    xs: torch.Tensor  # [calls, rank, M, K]
    w: torch.Tensor
    bias: torch.Tensor | None
    recv: torch.Tensor
    flags: torch.Tensor
    outs: torch.Tensor
    gave_up: torch.Tensor

    @classmethod
    def make(cls, w_kn, with_bias, M, N, tile, K=48, calls=3):
        tiles = triton.cdiv(M, tile[0]) * triton.cdiv(N, tile[1])
        return cls(
            w_kn,
            M,
            N,
            tile,
            torch.randn(calls, 2, M, K),
            torch.randn(N, K),
            torch.randn(N) if with_bias else None,
            torch.full((2, M, N), float("nan")).share_memory_(),  # a read before a push lands shows as NaN
            torch.zeros(2, tiles, dtype=torch.int32).share_memory_(),
            torch.zeros(calls, 2, M, N).share_memory_(),
            torch.zeros(2, 1, dtype=torch.int32).share_memory_(),
        )


def _interpreted_rank(rank, cases):
    torch.set_num_threads(1)
    for case in cases:
        counter = torch.zeros(1, dtype=torch.int32)
        for call in range(case.outs.shape[0]):  # one buffer for every call, the counter advanced before each
            counter += 1
            case.outs[call, rank] = gemm_push.launch(
                case.xs[call, rank],
                case.w.t().contiguous() if case.w_kn else case.w,
                case.w_kn,
                case.bias,
                torch.empty_like(case.outs[0, 0]),
                case.recv[rank],
                case.flags[rank],
                case.recv[1 - rank],
                case.flags[1 - rank],
                counter,
                case.gave_up[rank],
                rank,
                1,
                case.tile,
            )


@pytest.mark.skipif(torch.cuda.is_available(), reason="on GPUs the tests below run the compiled kernel")
def test_interpreted_kernel_sums_over_two_ranks():
    """Even and odd tile counts (the ranks own as many tiles, or rank 0 one more), edge tiles clipped in rows and
    columns or none, a partial K step, three calls through one buffer: every rank gets the sum over both ranks, the
    same bits on both. One pair of processes takes the cases in turn: each process spends seconds importing."""
    torch.manual_seed(0)
    cases = [
        # 6 tiles, the last row and column clipped; 3 tiles, none clipped, K = 48 in steps of 32
        InterpretedCase.make(w_kn=False, with_bias=True, M=80, N=48, tile=(32, 32, 16, 1, 4)),
        InterpretedCase.make(w_kn=True, with_bias=False, M=64, N=48, tile=(64, 16, 32, 1, 4)),
    ]
    context = mp.start_processes(_interpreted_rank, args=(cases,), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 240
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError("the pushing kernel hung")
    for case in cases:
        bias = 0 if case.bias is None else case.bias.double()
        want = (case.xs.double() @ case.w.double().t() + bias).sum(1)
        shape = f"{case.M}x{case.N} in tiles {case.tile[:2]}"
        torch.testing.assert_close(case.outs[:, 0].double(), want, rtol=1e-4, atol=1e-4, msg=lambda m: f"{shape}: {m}")
        assert torch.equal(case.outs[:, 0], case.outs[:, 1]), shape
        assert (case.flags == case.outs.shape[0]).all(), shape  # every tile's flag raised by the last call
        assert (case.gave_up == 0).all(), shape  # no wait gave up on the peer


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter: a GPU waits minutes before it gives up")
@pytest.mark.parametrize("rank", [0, 1])
def test_interpreted_kernel_gives_up_on_a_peer_that_never_comes_and_the_next_call_says_so(monkeypatch, rank):
    """One rank alone, its peer never calling: every wait gives up after a few flag reads, so the call returns with
    NaN where the peer's part is missing (every tile: each needs the peer's partial or final sum), and the rank's
    next call raises, naming the peer and the shapes. The next calls raise too: the buffers are out of step."""
    monkeypatch.setattr(gemm_push, "TILE", (32, 32, 16, 1, 4))
    monkeypatch.setattr(gemm_push, "MAX_FLAG_READS", 3)
    M, N, K = 64, 96, 48  # 6 tiles: 3 owned by each rank
    recv, flags = torch.zeros(2, M, N), torch.zeros(2, 6, dtype=torch.int32)
    one_program = 1 + gemm_push.RESERVED_SMS  # the interpreter runs a grid's programs one after another
    buffers = gemm_push.PeerBuffers(recv[rank], flags[rank], recv[1 - rank], flags[1 - rank], rank, one_program, "tp")
    x, w = torch.randn(M, K), torch.randn(N, K)
    out = buffers(x, w, False, None, torch.empty(M, N))
    assert out.isnan().all()
    assert int(buffers.gave_up) == 1 and (flags[1 - rank] == 1).all()  # it raised the flags of the peer's tiles
    for _ in range(2):
        with pytest.raises(
            RuntimeError,
            match=rf"rank {rank} of group 'tp' gave up waiting for rank {1 - rank} in its call 1 \(this rank's "
            rf"last call: x \[{M}, {K}\] times weight \[{N}, {K}\]\); that call's output is NaN",
        ):
            buffers(x, w, False, None, torch.empty(M, N))


# Compiles the kernel to sm_90 machine code with Triton's own ptxas: one variant per argv word, its HAS_BIAS and
# W_KN as two digits; prints each variant with its shared bytes.
COMPILE_FOR_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from turbo_inductor.kernels.symm_mem import gemm_push

block_m, block_n, block_k, stages, warps = gemm_push.TILE
desc = lambda rows, cols: f"tensordesc<bf16[{rows}, {cols}]>"
for variant in sys.argv[1:]:
    with_bias, w_kn = (digit == "1" for digit in variant)
    signature = {
        "x_desc": desc(block_m, block_k),
        "w_desc": desc(block_k, block_n) if w_kn else desc(block_n, block_k),
        "bias_ptr": "*bf16",
        "out_desc": desc(block_m, block_n),
        "recv_desc": desc(block_m, block_n),
        "flags_ptr": "*i32",
        "peer_recv_desc": desc(block_m, block_n),
        "peer_flags_ptr": "*i32",
        "call_ptr": "*i32",
        "gave_up_ptr": "*i32",
        **dict.fromkeys(("max_reads", "rank", "M", "N", "K"), "i32"),
    }
    constants = dict(HAS_BIAS=with_bias, W_KN=w_kn, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                     GROUP=gemm_push.GROUP_M, STAGES=stages, PROGRAMS=128)
    names = gemm_push.gemm_push_kernel.arg_names
    assert names == [*signature, *constants], names
    source = ASTSource(
        fn=gemm_push.gemm_push_kernel,
        signature={**signature, **dict.fromkeys(constants, "constexpr")},
        constexprs={(names.index(name),): value for name, value in constants.items()},
    )
    options = {"num_warps": warps, "num_stages": stages}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    assert compiled.asm["cubin"]
    print(variant, compiled.metadata.shared)
"""


def test_the_kernel_compiles_for_hopper():
    """The kernel as the GPU runs it, not as the interpreter does: Triton compiles it to sm_90 machine code with its
    own ptxas, no GPU needed, in the shared memory the design budgets (docs/kernels.md). With bias and the [N, K]
    weight, and without bias and the [K, N] weight, in one process of its own: under TRITON_INTERPRET=1 nothing
    compiles."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    variants = ["10", "01"]  # HAS_BIAS, W_KN
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_HOPPER, *variants],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shared = dict(line.split() for line in done.stdout.splitlines()[-len(variants) :])
    assert list(shared) == variants, done.stdout
    for variant, size in shared.items():
        assert int(size) <= 227 * 1024, variant


# ---- launch heuristics and the choice between the kernel and GEMM then all-reduce -----------------------------


@pytest.mark.parametrize(
    "tiles, sms, programs", [(1024, 132, 128), (1056, 132, 118), (10, 132, 10), (1, 4, 1), (300, 8, 4)]
)
def test_programs_leave_sms_free_without_adding_rounds(tiles, sms, programs):
    assert gemm_push.programs_for(tiles, sms) == programs
    assert programs <= max(1, sms - gemm_push.RESERVED_SMS)
    assert triton.cdiv(tiles, programs) == triton.cdiv(tiles, max(1, min(tiles, sms - gemm_push.RESERVED_SMS)))


def test_what_the_kernel_declines_is_named(fake_group):
    group = fake_group.group_name
    x, w = torch.randn(4096, 1024, dtype=torch.bfloat16), torch.randn(1024, 1024, dtype=torch.bfloat16)
    assert gemm_push.declines(x, w, None, group) is None
    assert gemm_push.declines(x, w.t(), None, group) is None  # the column-parallel backward's weight^T
    assert "bf16 or fp16" in gemm_push.declines(x.float(), w.float(), None, group)
    assert "multiples of 8" in gemm_push.declines(x[:, :1020], w[:, :1020], None, group)
    assert "multiples of 8" in gemm_push.declines(x, w[::2], None, group)  # neither form is row-major
    assert "at least 8 MiB" in gemm_push.declines(x[:16], w, None, group)


@pytest.mark.parametrize("dtype, dynamic", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True)])
def test_where_the_kernel_declines_the_graph_is_gemm_then_all_reduce(fake_group, monkeypatch, dtype, dynamic):
    """Declined when traced (fp32; bf16 under 8 MiB), impl=push traces GEMM then the functional all-reduce, as the
    reference does, forward and backward, with the row count symbolic too. (The implementation is made available
    on CPU for the trace: what it declines never reaches the GPU kernel.)"""
    push = registry.implementations("gemm_allreduce_fwd")["push"]
    monkeypatch.setitem(
        registry._IMPLS["gemm_allreduce_fwd"], "push", dataclasses.replace(push, unavailable_reason=lambda device: None)
    )
    registry._candidates.cache_clear()
    try:
        torch.manual_seed(0)
        model = RowParallel("funcol", fake_group).to(dtype)
        x = torch.randn(3, 5, 32, dtype=dtype)
        want = run_step(model, x, "inductor")
        model.zero_grad(set_to_none=True)
        turbo_inductor.reset_records()
        got, codes = run_and_get_code(run_step, model, x, "primus_turbo", PUSH, dynamic)
        assert turbo_inductor.rewrite_counts()["gemm_allreduce"] == 1
        for code in codes:  # forward and backward: an all-reduce each (of y, of dy), no pushing kernel
            assert "turbo_inductor" not in code
            assert len(re.findall(r"_c10d_functional\.all_reduce_?\.default\(", code)) == 1, code
        for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
            torch.testing.assert_close(g, w)  # the same program as Inductor's: equal to the dtype's rounding
    finally:
        registry._candidates.cache_clear()


def test_forced_on_cpu_it_says_why_it_cannot_run(fake_group):
    x, w = torch.randn(6, 32), torch.randn(24, 32)
    with pytest.raises(
        RuntimeError,
        match="implementation 'push' of gemm_allreduce_fwd cannot run on cpu: symmetric memory needs a GPU",
    ):
        torch.ops.turbo_inductor.gemm_allreduce(x, w, None, fake_group.group_name, PUSH["impl"])


def test_fake_gives_the_output_shape():
    x, w = torch.randn(6, 32, device="meta"), torch.randn(24, 32, device="meta")
    assert torch.ops.turbo_inductor_symm_mem.gemm_push_fwd(x, w, None, "g").shape == (6, 24)


# ---- two GPUs --------------------------------------------------------------------------------------------------


def _pushes_on_two_gpus(rank, port):
    import torch.distributed as dist

    group, device = init(rank, port)
    gemm_push.MIN_OUTPUT_BYTES = 0  # the kernel at the small sizes below, not GEMM then all-reduce
    try:
        # the op, eagerly: odd sizes (edge tiles clipped), with and without bias, both weight forms, several calls
        torch.manual_seed(0)
        w, b = torch.randn(520, 264, device=device, dtype=torch.bfloat16), torch.randn(520, device=device)
        for call, (rows, bias, weight) in enumerate(
            [(300, b.bfloat16(), w), (300, None, w), (1000, None, w), (300, None, w.t().contiguous().t())]
        ):
            torch.manual_seed(10 * call + rank)
            x = torch.randn(rows, weight.shape[1], device=device, dtype=torch.bfloat16) / 16
            got = torch.ops.turbo_inductor.gemm_allreduce(x, weight, bias, group.group_name, PUSH["impl"])
            want = torch.nn.functional.linear(x.double(), weight.double(), None if bias is None else bias.double())
            dist.all_reduce(want, group=group)
            # bf16's gate, against the output's scale: each rank's partial is rounded to bf16 before the sum
            assert (got.double() - want).abs().max() <= 1e-2 * want.abs().max()
            everyone = [torch.empty_like(got) for _ in range(WORLD)]
            dist.all_gather(everyone, got, group=group)
            assert torch.equal(everyone[0], everyone[1])
        assert gemm_push._BUFFERS[(520, torch.bfloat16, device, group.group_name)].rows == 1000  # grown once
        torch.library.opcheck(torch.ops.turbo_inductor_symm_mem.gemm_push_fwd, (x, w, None, group.group_name))

        # compiled, training: the row-parallel linear's forward and the column-parallel linear's input gradient
        for model, rewrite in (
            (RowParallel("funcol", group), "gemm_allreduce"),
            (ColumnParallel("funcol"), "gemm_allreduce_dgrad"),
        ):
            torch.manual_seed(0)  # the same weights on both ranks
            model = model.to(device, torch.bfloat16)
            torch.manual_seed(1 + rank)  # each rank its own input
            x = torch.randn(4, 5, 32, device=device, dtype=torch.bfloat16)
            want = run_step(model, x, "inductor")
            model.zero_grad(set_to_none=True)
            turbo_inductor.reset_records()
            registry.reset_kernel_calls()
            got = run_step(model, x, "primus_turbo", PUSH)
            assert turbo_inductor.rewrite_counts()[rewrite] == 1
            calls = registry.kernel_calls()  # chosen when traced (the fake trace and the graph's may both ask)
            assert calls[("gemm_allreduce_fwd", "push")] >= 1, calls
            # and the kernel ran: the forward's [20, 24] output, or the backward's [20, 32] input gradient
            assert (
                gemm_push._BUFFERS[
                    (24 if rewrite == "gemm_allreduce" else 32, torch.bfloat16, device, group.group_name)
                ].calls()
                >= 1
            )
            for g, w_ in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
                torch.testing.assert_close(g, w_, rtol=1e-2, atol=1e-2)

        # replayed as CUDA graphs: the call counter lives on the device, so every replay is a call of its own
        def row_parallel(x, w):
            return funcol.all_reduce(torch.nn.functional.linear(x, w), "sum", group.group_name)

        torch._dynamo.reset()
        graphed = torch.compile(row_parallel, backend="primus_turbo", options={"triton.cudagraphs": True, **PUSH})
        buffers = gemm_push.peer_buffers(300, 520, torch.bfloat16, device, group.group_name)
        before = buffers.calls()
        for step in range(4):
            torch.manual_seed(100 * step + rank)
            x = torch.randn(300, 264, device=device, dtype=torch.bfloat16) / 16
            torch.compiler.cudagraph_mark_step_begin()
            got = graphed(x, w).clone()
            want = torch.nn.functional.linear(x.double(), w.double())
            dist.all_reduce(want, group=group)
            assert (got.double() - want).abs().max() <= 1e-2 * want.abs().max(), step
        assert buffers.calls() - before >= 4
    finally:
        dist.destroy_process_group()


@TWO_GPUS
def test_two_gpus_push_matches_gemm_then_all_reduce_and_inductor():
    spawn(_pushes_on_two_gpus)
