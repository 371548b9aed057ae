"""Allocation strategies: in which order the master tries segments for a new object's replicas.

A strategy only orders candidate segments; the master then places each replica on the next
segment (distinct segments per object) that has a free range big enough. Register new policies
with :func:`register`; the master picks one by name (``master.allocation_strategy``).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class SegmentView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...
    def free_ratio(self) -> float: ...


S = TypeVar("S", bound=SegmentView)


class AllocationStrategy(ABC):
    """Orders segments for placement. Must be pure (no I/O) and must not drop preferred ones."""

    @abstractmethod
    def order(self, segments: Sequence[S], writer_host: str, rng: random.Random) -> list[S]: ...


STRATEGIES: dict[str, Callable[[], AllocationStrategy]] = {}


def register(name: str) -> Callable[[type[AllocationStrategy]], type[AllocationStrategy]]:
    def deco(cls: type[AllocationStrategy]) -> type[AllocationStrategy]:
        STRATEGIES[name] = cls
        return cls

    return deco


def make(name: str) -> AllocationStrategy:
    return STRATEGIES[name]()


@register("random")
class RandomStrategy(AllocationStrategy):
    """Start at a random segment and go round (Mooncake's default)."""

    def order(self, segments: Sequence[S], writer_host: str, rng: random.Random) -> list[S]:
        if not segments:
            return []
        start = rng.randrange(len(segments))
        return [*segments[start:], *segments[:start]]


@register("free_ratio_first")
class FreeRatioFirst(AllocationStrategy):
    """Emptiest segments first (ties broken randomly) — spreads load evenly."""

    def order(self, segments: Sequence[S], writer_host: str, rng: random.Random) -> list[S]:
        keyed = [(-s.free_ratio(), rng.random(), i) for i, s in enumerate(segments)]
        return [segments[i] for _, _, i in sorted(keyed)]


@register("local_first")
class LocalFirst(AllocationStrategy):
    """Segments on the writer's host first (a local memcpy), then the rest at random."""

    def order(self, segments: Sequence[S], writer_host: str, rng: random.Random) -> list[S]:
        local = [s for s in segments if s.host == writer_host]
        rest = [s for s in segments if s.host != writer_host]
        rng.shuffle(rest)
        return local + rest
