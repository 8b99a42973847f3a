"""Tensor-parallel code as users write it, and the tests' two ranks: a row-parallel linear whose result is
all-reduced, a column-parallel one whose input gradient is (Megatron's copy to the tensor-parallel region), a
compiled training step of either, and ``spawn``, which runs a function on two processes."""

import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
import torch.nn as nn

import turbo_inductor

WORLD = 2


class RowParallel(nn.Module):
    """A row-parallel linear as tensor-parallel code writes it: its partial result all-reduced over the group."""

    def __init__(self, spelling, group, bias=True, out_features=24):
        super().__init__()
        self.spelling, self.group = spelling, group
        self.proj = nn.Linear(32, out_features, bias=bias)

    def forward(self, x):
        y = self.proj(x)
        if self.spelling == "funcol":
            y = funcol.all_reduce(y, "sum", self.group)
        else:
            dist.all_reduce(y, group=self.group)
        return torch.relu(y) * 2


class SumOverRanks(torch.autograd.Function):
    """Megatron's copy to the tensor-parallel region: the identity forward, the gradient summed over the ranks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return funcol.all_reduce(grad, "sum", dist.group.WORLD)


def autograd_function(name: str, forward, backward) -> type:
    """A ``torch.autograd.Function`` of one tensor with these forward and backward."""
    return type(
        name,
        (torch.autograd.Function,),
        {"forward": staticmethod(lambda ctx, x: forward(x)), "backward": staticmethod(lambda ctx, g: backward(g))},
    )


def sum_over_ranks(g):
    return funcol.all_reduce(g, "sum", dist.group.WORLD)


def sum_over_ranks_in_place(g):
    g = g.clone()
    dist.all_reduce(g, group=dist.group.WORLD)
    return g


def identity(x):
    return x.view_as(x)


# Megatron's copy to the tensor-parallel region in two spellings, and two near misses (a scaled sum; a forward that
# is not the identity).
COPY_SPELLINGS = {
    "funcol": autograd_function("CopyFuncol", identity, sum_over_ranks),
    "in_place": autograd_function("CopyInPlace", identity, sum_over_ranks_in_place),
    "scaled": autograd_function("CopyScaled", identity, lambda g: sum_over_ranks(g) * 0.5),
    "not_identity": autograd_function("NotIdentity", lambda x: x * 2, lambda g: sum_over_ranks(g) * 2),
}


class ColumnParallel(nn.Module):
    """A column-parallel linear as tensor-parallel code writes it; ``readers``: how many linears read the copy."""

    def __init__(self, spelling, readers=1, bias=True, out_features=24):
        super().__init__()
        self.copy, self.readers = COPY_SPELLINGS[spelling], readers
        self.proj = nn.Linear(32, out_features, bias=bias)
        if readers == 2:
            self.other = nn.Linear(32, 24, bias=False)

    def forward(self, x):
        h = self.copy.apply(x)
        y = self.proj(h)
        if self.readers == 2:
            y = y + self.other(h)
        return torch.relu(y) * 2


def run_step(model, x, backend, options=None, dynamic=None):
    """(output, x's gradient, the parameters' gradients) of ``model`` compiled with ``backend``, the output's
    cotangent all ones."""
    torch._dynamo.reset()
    x = x.detach().clone().requires_grad_()
    out = torch.compile(model, backend=backend, options=options, dynamic=dynamic)(x)
    out.backward(torch.ones_like(out))
    return out.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def matches_inductor(model, x, options=None):
    """Assert that primus_turbo's output and gradients equal Inductor's on ``model``; return them."""
    want = run_step(model, x, "inductor")
    model.zero_grad(set_to_none=True)
    turbo_inductor.reset_records()
    got = run_step(model, x, "primus_turbo", options)
    for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    return got


def autocast_matches_inductor(model, x):
    """primus_turbo's (output, x's gradient, parameters' gradients) of ``model`` under autocast(bfloat16), asserted
    equal to Inductor's in dtype and within bf16's rounding; returned."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = run_step(model, x, "inductor")
        model.zero_grad(set_to_none=True)
        turbo_inductor.reset_records()
        got = run_step(model, x, "primus_turbo")
    for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)
    return got


# ---- two processes ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker, *args, timeout: float = 600):
    """``worker(rank, port, *args)`` on each rank; a rank still running after ``timeout`` seconds fails the test."""
    port = free_port()
    context = mp.start_processes(
        _run_then_exit, args=(worker, port, *args), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError(f"{worker.__name__} still ran after {timeout} s: a hang")


def _run_then_exit(rank, worker, port, *args):
    """``worker`` on this rank, then an immediate exit: about one run in ten, a background thread of the
    distributed / compile stack still ran at interpreter shutdown and the process aborted ("terminate called without
    an active exception") after the test had passed. A failure still raises (and is reported) before this."""
    worker(rank, port, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def init(rank: int, port: int):
    """NCCL with one GPU per rank where there are enough GPUs, else gloo on CPU (the environment, TRITON_INTERPRET
    included, is the parent's). Returns (the group, this rank's device)."""
    torch.set_num_threads(1)
    if torch.cuda.device_count() >= WORLD:
        torch.cuda.set_device(rank)
        backend, device = "nccl", torch.device("cuda", rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    return dist.group.WORLD, device
