"""Policies are chosen by name from config files and flags; one lookup turns a bad name or a bad
parameter into a ``ConfigError`` the same way for every kind of policy."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from kvcake.core.errors import ConfigError

P = TypeVar("P")


def make_named(
    kind: str, registry: Mapping[str, Callable[..., P]], name: str, params: Mapping[str, object]
) -> P:
    """``registry[name](**params)``; ``kind`` (e.g. "prefill policy") names it in errors."""
    cls = registry.get(name)
    if cls is None:
        raise ConfigError(f"unknown {kind} {name!r}; choose from {sorted(registry)}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise ConfigError(f"{kind} {name!r}: {exc}") from None
