"""Backend options: from ``torch.compile(..., options={...})`` and from environment variables.

Option keys of our own:
  - one key per rewrite pass, named as the pass (``"rmsnorm"``, ``"rmsnorm_residual"``, ...): ``True``/``False``
    (env ``TURBO_INDUCTOR_<NAME>=1|0``), or the pass's own values (``"fp8": "rowwise"``);
  - ``"impl"``: the kernel implementation to force, one name for every kernel (``"triton"``) or per kernel
    (``"rmsnorm_fwd=reference,rmsnorm_bwd=triton"`` or a dict) (env ``TURBO_INDUCTOR_IMPL``);
  - ``"strict"``: a failing rewrite raises instead of falling back to the unrewritten graph with a warning
    (env ``TURBO_INDUCTOR_STRICT``);
  - ``"record_graphs"``: keep the graph code before/after the passes in :func:`turbo_inductor.compile_records`
    (env ``TURBO_INDUCTOR_RECORD_GRAPHS``).
Every other key must be an Inductor config key (``"max_autotune"``, ``"triton.cudagraphs"``...) and is passed to
Inductor unchanged. ``options=`` wins over the environment.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from torch._inductor import config as inductor_config

from .kernels import registry

ENV_PREFIX = "TURBO_INDUCTOR_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"primus_turbo: option {key!r} takes true/false, got {value!r}")


def _parse_impl(value: Any) -> str:
    if isinstance(value, Mapping):
        value = ",".join(f"{k}={v}" for k, v in value.items())
    if not isinstance(value, str):
        raise ValueError(f"primus_turbo: option 'impl' takes a string or a dict, got {value!r}")
    for kernel, name in registry.parse_spec(value):
        known = registry.known_names(kernel)
        if name != registry.AUTO and name not in known:
            where = f" for {kernel}" if kernel else ""
            raise ValueError(f"primus_turbo: unknown implementation {name!r}{where}; choose from {sorted(known)}")
    return value


@dataclasses.dataclass(frozen=True)
class Options:
    passes: tuple[tuple[str, Any], ...]  # (pass name, its option value), in pass order
    impl: str = registry.AUTO
    strict: bool = False
    record_graphs: bool = False
    inductor: tuple[tuple[str, Any], ...] = ()  # Inductor config passed through

    def value(self, pass_name: str) -> Any:
        return dict(self.passes)[pass_name]

    def fingerprint(self) -> str:
        """What the passes' output depends on, for the cache key."""
        return repr((self.passes, self.impl))

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None, passes: Sequence) -> Options:
        """``passes``: the rewrite passes (each with ``name``, ``default`` and ``parse_option(value)``)."""
        options = dict(options or {})

        def value(key: str, default: Any) -> Any:
            if key in options:
                return options.pop(key)
            return os.environ.get(ENV_PREFIX + key.upper(), default)

        pass_names = [p.name for p in passes]
        values = tuple((p.name, p.parse_option(value(p.name, p.default))) for p in passes)
        impl = _parse_impl(value("impl", registry.AUTO))
        strict = parse_bool("strict", value("strict", False))
        record_graphs = parse_bool("record_graphs", value("record_graphs", False))
        inductor = []
        for key, val in options.items():
            if not _is_inductor_option(key):
                raise ValueError(
                    f"primus_turbo: unknown option {key!r}: not a pass ({', '.join(pass_names)}), not one of "
                    "impl/strict/record_graphs, and not an Inductor config key"
                )
            inductor.append((key, val))
        return cls(values, impl, strict, record_graphs, tuple(inductor))


def _is_inductor_option(key: str) -> bool:
    return key in inductor_config.get_config_copy()
