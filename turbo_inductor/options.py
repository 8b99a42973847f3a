"""Backend options, from ``torch.compile(..., options={...})`` or ``TURBO_INDUCTOR_<KEY>`` environment variables.

Keys: each rewrite pass's name, the ``GENERAL`` ones, and any Inductor config key (passed through).
``options=`` wins over the environment. ``option_table`` documents them for the README.
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
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
class GeneralOption:
    key: str
    default: Any
    meaning: str


GENERAL = (
    GeneralOption(
        "impl",
        registry.AUTO,
        'force a kernel implementation: `"triton"`, `"native"`, `"reference"`, ..., or one per kernel '
        '(`"rmsnorm_fwd=triton,rmsnorm_bwd=reference"` or a dict). `"autotune"` times each once per argument '
        'signature and keeps the fastest. `"prefer:NAME"`: NAME where it runs and takes the arguments, else `"auto"`: '
        "the highest-priority one that runs on the device and takes the arguments",
    ),
    GeneralOption("strict", False, "a failing rewrite raises. Otherwise the graph is restored and a warning printed"),
    GeneralOption("record_graphs", False, "keep the graph code before and after the passes in `compile_records()`"),
)


def option_table(passes: Sequence) -> str:
    """The options as a Markdown list, lines within 120 characters (the README's)."""
    entries = [(p.name, p.default, getattr(p, "option_doc", "") or _summary(p)) for p in passes]
    entries += [(option.key, option.default, option.meaning) for option in GENERAL]
    entries.append(("<any Inductor config key>", None, "passed to Inductor unchanged."))
    lines = []
    for key, default, meaning in entries:
        head = f"- `{key}`" + ("" if default is None else f" (default `{_literal(default)}`)")
        lines += textwrap.wrap(f"{head}: {meaning}", width=120, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)


def _summary(rewrite) -> str:
    return (type(rewrite).__doc__ or "").strip().splitlines()[0].replace("``", "`")


def _literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


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
        defaults = {option.key: option.default for option in GENERAL}
        impl = _parse_impl(value("impl", defaults["impl"]))
        strict = parse_bool("strict", value("strict", defaults["strict"]))
        record_graphs = parse_bool("record_graphs", value("record_graphs", defaults["record_graphs"]))
        inductor = []
        for key, val in options.items():
            if not _is_inductor_option(key):
                raise ValueError(
                    f"primus_turbo: unknown option {key!r}: not a pass ({', '.join(pass_names)}), not one of "
                    f"{'/'.join(defaults)}, and not an Inductor config key"
                )
            inductor.append((key, val))
        return cls(values, impl, strict, record_graphs, tuple(inductor))


def _is_inductor_option(key: str) -> bool:
    return key in inductor_config.get_config_copy()
