"""The kernel dispatcher: implementations that take only some arguments, forced implementations, autotuning (per
argument signature, once, on tensors being traced too), and the backend option that turns autotuning on."""

import time

import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from turbo_inductor.kernels import registry
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_matches_inductor

KERNEL = "test_dispatcher_scale"
CALLS = []


def _available(device):
    return None


def _not_on(device):
    return "never available here"


@registry.implementation(
    KERNEL,
    "slow",
    priority=30,
    unavailable_reason=_available,
    supports=lambda x, factor: None if factor > 0 else "positive factors only",
)
def _slow(x, factor):
    CALLS.append("slow")
    time.sleep(0.002)  # sure to lose every measurement
    return x * factor


@registry.implementation(KERNEL, "fast", priority=20, unavailable_reason=_available)
def _fast(x, factor):
    CALLS.append("fast")
    return x * factor


@registry.implementation(KERNEL, "absent", priority=40, unavailable_reason=_not_on)
def _absent(x, factor):
    raise AssertionError("an unavailable implementation must never run")


@pytest.fixture(autouse=True)
def clean():
    CALLS.clear()
    registry._WINNERS.clear()
    yield
    registry._WINNERS.clear()


def test_best_available_that_takes_the_arguments():
    x = torch.randn(8)
    select = registry.select(KERNEL, x.device)
    torch.testing.assert_close(select(x, 2.0), x * 2)
    torch.testing.assert_close(select(x, -2.0), x * -2)
    assert CALLS == ["slow", "fast"]  # the unavailable one is skipped; the slow one declines negative factors
    assert registry.kernel_calls()[(KERNEL, "slow")] == 1 and registry.kernel_calls()[(KERNEL, "fast")] == 1


def test_forced_implementation_never_substitutes():
    x = torch.randn(8)
    with pytest.raises(ValueError, match="'slow' of test_dispatcher_scale cannot take these arguments: positive"):
        registry.select(KERNEL, x.device, "slow")(x, -1.0)
    with pytest.raises(RuntimeError, match="'absent' of test_dispatcher_scale cannot run on cpu: never available"):
        registry.select(KERNEL, x.device, "absent")
    assert CALLS == []


def test_a_preferred_implementation_runs_where_it_can_and_yields_to_the_ranking_elsewhere():
    """``prefer:NAME``, which rewrites write from measured data: NAME first, auto's choice where it declines the call
    or does not run on the device, never an error; a name no kernel has is one."""
    x = torch.randn(8)
    torch.testing.assert_close(registry.select(KERNEL, x.device, "prefer:fast")(x, 2.0), x * 2)
    assert CALLS == ["fast"]  # ahead of slow, which ranks higher
    torch.testing.assert_close(registry.select(KERNEL, x.device, f"{KERNEL}=prefer:slow")(x, -2.0), x * -2)
    assert CALLS == ["fast", "fast"]  # slow declines negative factors: the ranking's next
    torch.testing.assert_close(registry.select(KERNEL, x.device, "prefer:absent")(x, 3.0), x * 3)
    assert CALLS == ["fast", "fast", "slow"]  # absent does not run here: the ranking's first
    assert registry.candidates(KERNEL, x.device, "prefer:fast") == ["fast"]  # it takes every argument
    assert registry.candidates(KERNEL, x.device, "prefer:slow") == ["slow", "fast"]
    with pytest.raises(ValueError, match="no kernel has an implementation 'cutlass' to prefer"):
        registry.select(KERNEL, x.device, "prefer:cutlass")


def test_the_environments_choice_outranks_a_preference(monkeypatch):
    """``TURBO_INDUCTOR_IMPL`` is the user's; a ``prefer:`` a rewrite wrote from measured data yields to it."""
    x = torch.randn(8)
    monkeypatch.setenv(registry.IMPL_ENV, f"{KERNEL}=slow")
    with pytest.raises(ValueError, match="'slow' of test_dispatcher_scale cannot take these arguments"):
        registry.select(KERNEL, x.device, "prefer:fast")(x, -1.0)
    monkeypatch.setenv(registry.IMPL_ENV, "other_kernel=fast")
    assert registry.candidates(KERNEL, x.device, "prefer:fast") == ["fast"]


def test_autotune_measures_once_per_signature_and_keeps_the_fastest():
    x = torch.randn(8)
    tuned = registry.select(KERNEL, x.device, "autotune")
    torch.testing.assert_close(tuned(x, 3.0), x * 3)
    assert set(CALLS) == {"slow", "fast"}  # both measured
    CALLS.clear()
    y = torch.randn(8)
    torch.testing.assert_close(tuned(y, 3.0), y * 3)  # the same signature: no new measurement, the winner runs
    assert CALLS == ["fast"]
    assert registry.autotuned() == {(KERNEL, "cpu", ((8,), torch.float32), 3.0): "fast"}
    CALLS.clear()
    tuned(torch.randn(16), 3.0)  # a new size is measured again
    assert "slow" in CALLS
    CALLS.clear()
    tuned(x, -1.0)  # the slow one declines: only the fast one is a candidate
    assert set(CALLS) == {"fast"}


def test_autotune_on_tensors_being_traced_measures_real_ones():
    with FakeTensorMode():
        fake = torch.empty(32)
        out = registry.select(KERNEL, fake.device, "autotune")(fake, 2.0)
        assert out.shape == (32,)
    assert registry.autotuned()[(KERNEL, "cpu", ((32,), torch.float32), 2.0)] == "fast"


def test_autotune_spec_per_kernel_and_environment(monkeypatch):
    x = torch.randn(8)
    monkeypatch.setenv(registry.IMPL_ENV, f"{KERNEL}=autotune")
    registry.select(KERNEL, x.device)(x, 1.0)
    assert len(registry.autotuned()) == 1


def test_backend_option_autotune_trains_like_inductor():
    model = nn.Sequential(nn.Linear(32, 64), nn.RMSNorm(64, eps=1e-6)).to(DEVICE)
    counts = assert_matches_inductor(model, [torch.randn(4, 32, device=DEVICE)], options={"impl": "autotune"})
    assert counts["rmsnorm"] == 1
    assert {key[0] for key in registry.autotuned()} == {"rmsnorm_fwd", "rmsnorm_bwd"}
    assert {name for (kernel, name) in registry.kernel_calls()} <= {"triton", "reference", "native"}


def test_unknown_implementation_is_named():
    with pytest.raises(ValueError, match="no implementation 'cutlass'.*'autotune'"):
        registry.select(KERNEL, torch.device("cpu"), "cutlass")


def test_no_implementation_taking_the_arguments_is_named():
    kernel = "test_dispatcher_picky"
    registry.implementation(
        kernel,
        "picky",
        priority=1,
        unavailable_reason=_available,
        supports=lambda x: "odd sizes only" if x.numel() % 2 == 0 else None,
    )(lambda x: x)
    with pytest.raises(ValueError, match=r"no implementation of test_dispatcher_picky takes .*picky: odd sizes only"):
        registry.select(kernel, torch.device("cpu"))(torch.randn(4))
    assert registry.select(kernel, torch.device("cpu"))(torch.ones(3)).sum() == 3


def test_autotune_times_grouped_kernels_on_sorted_group_ends():
    """Traced offs have no values: drawn at random they would leave most groups empty, and every candidate of a
    grouped kernel would time alike. Autotune draws balanced group ends at multiples of 16 instead, the last at S
    (where S is each kernel's grouped dimension: the FP8 wgrad's operands come transposed)."""
    from turbo_inductor.kernels.reference.grouped_mm import GROUPED_KERNELS

    S, K, E = 200, 32, 4
    with FakeTensorMode():
        rows, columns, offs = torch.empty(S, K), torch.empty(K, S), torch.empty(E, dtype=torch.int32)
    arguments = {
        "grouped_gemm": (rows, None, offs, None),
        "grouped_gemm_wgrad": (rows, None, offs, None),
        "fp8_grouped_gemm": (rows, None, None, None, offs, None),
        "fp8_grouped_gemm_wgrad": (columns, None, None, None, offs, None),
        "fp8_quantize_grouped": (rows, offs, None),
    }
    assert set(arguments) == set(GROUPED_KERNELS) and set(GROUPED_KERNELS) <= set(registry.kernels())
    for kernel, args in arguments.items():
        real = registry._real_arguments(kernel, args)
        (ends,) = [a for a in real if isinstance(a, torch.Tensor) and a.dtype == torch.int32]
        assert ends.tolist() == [48, 96, 144, 200], kernel


def test_a_capability_is_declared_per_implementation_name_whatever_the_device():
    """One GEMM per group reads offs on the host, so it never launches ahead of the GPU, even where it is unavailable
    (the cost table reads this on CPU); an undeclared capability holds, as for a name no implementation has."""
    for kernel in ("grouped_gemm", "grouped_gemm_wgrad"):
        assert not registry.declares(kernel, "vendor_per_group", registry.LAUNCHES_AHEAD)
        assert registry.declares(kernel, "vendor", registry.LAUNCHES_AHEAD)
        assert registry.declares(kernel, registry.AUTO, registry.LAUNCHES_AHEAD)
