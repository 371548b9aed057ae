"""Prefill-instance selection policies, pluggable by name through :data:`PREFILL_POLICIES`.

A policy sees a :class:`PrefillView` (one entry per prefill instance, snapshot order) and
returns a :class:`PrefillChoice`, or ``None`` when no instance is healthy. Ties always go to the
earliest instance in snapshot order, so decisions are deterministic. State (the round-robin
cursor, the random generator) lives in the policy object; the conductor forwards
:meth:`PrefillPolicy.on_accept` after every accepted request.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from kvcake.conductor.registry import make_named
from kvcake.conductor.view import PrefillView
from kvcake.core.api import Accept
from kvcake.core.config import require
from kvcake.core.ids import InstanceId

if TYPE_CHECKING:
    from kvcake.conductor.config import ConductorConfig


@dataclass(frozen=True, slots=True)
class PrefillChoice:
    index: int  # position in the snapshot's prefill tuple
    fetch: bool  # fetch blocks [local, best_len) from view.best_holder first
    ttft_s: float  # queue + (transfer) + prefill estimate for this instance


class PrefillPolicy(ABC):
    """Picks a prefill instance. Invariant: only healthy instances are ever chosen."""

    name: ClassVar[str]

    @classmethod
    def from_config(cls, config: ConductorConfig) -> PrefillPolicy:
        return cls()

    @abstractmethod
    def choose(self, view: PrefillView) -> PrefillChoice | None: ...

    def on_accept(self, decision: Accept) -> None:  # noqa: B027 (optional hook)
        """Called once per accepted request (by :meth:`Conductor.on_accept`)."""


def _local_choice(view: PrefillView, i: int) -> PrefillChoice:
    return PrefillChoice(i, False, float(view.ttft_local()[i]))


class RandomPolicy(PrefillPolicy):
    """Uniform over healthy instances, from a seeded generator (advances on every call)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    @classmethod
    def from_config(cls, config: ConductorConfig) -> PrefillPolicy:
        return cls(config.seed)

    def choose(self, view: PrefillView) -> PrefillChoice | None:
        healthy = view.healthy_indices
        if healthy.size == 0:
            return None
        return _local_choice(view, int(healthy[self._rng.randrange(healthy.size)]))


class RoundRobinPolicy(PrefillPolicy):
    """The next healthy instance after the last accepted one (snapshot order, wrapping).
    The cursor is an instance id, so membership changes do not skip or repeat others."""

    name = "round-robin"

    def __init__(self) -> None:
        self.last: InstanceId | None = None

    def choose(self, view: PrefillView) -> PrefillChoice | None:
        healthy = view.healthy_indices
        if healthy.size == 0:
            return None
        start = 0
        if self.last is not None and self.last in view.ids:
            start = view.ids.index(self.last) + 1
        after = healthy[healthy >= start]
        return _local_choice(view, int(after[0] if after.size else healthy[0]))

    def on_accept(self, decision: Accept) -> None:
        self.last = decision.prefill


class LeastLoadPolicy(PrefillPolicy):
    """Smallest predicted queue (``queued_seconds``), ignoring caches."""

    name = "least-load"

    def choose(self, view: PrefillView) -> PrefillChoice | None:
        if not view.healthy.any():
            return None
        return _local_choice(view, int(np.argmin(np.where(view.healthy, view.queued, np.inf))))


class LocalCacheAwarePolicy(PrefillPolicy):
    """Smallest queue + prefill time using each instance's own cached prefix."""

    name = "local-cache-aware"

    def choose(self, view: PrefillView) -> PrefillChoice | None:
        if not (view.all_healthy or view.healthy.any()):
            return None
        return _local_choice(view, int(view.ttft_local().argmin()))


class GlobalCacheAwarePolicy(PrefillPolicy):
    """Paper Algorithm 1: smallest queue + transfer + prefill, where an instance whose own prefix
    is much shorter than the best one anywhere (ratio above ``threshold``) is assumed to fetch
    the missing blocks from the best holder — and then keeps them (hot-block replication)."""

    name = "global-cache-aware"

    def __init__(self, threshold: float = 1.2) -> None:
        require(threshold >= 1.0, f"kvcache_balancing_threshold must be >= 1, got {threshold}")
        self.threshold = threshold

    @classmethod
    def from_config(cls, config: ConductorConfig) -> PrefillPolicy:
        return cls(config.kvcache_balancing_threshold)

    def choose(self, view: PrefillView) -> PrefillChoice | None:
        if not (view.all_healthy or view.healthy.any()):
            return None
        ttft, fetch = view.ttft_global(self.threshold)
        i = int(ttft.argmin())
        return PrefillChoice(i, bool(fetch[i]), float(ttft[i]))


PREFILL_POLICIES: dict[str, type[PrefillPolicy]] = {
    p.name: p
    for p in (
        RandomPolicy,
        RoundRobinPolicy,
        LeastLoadPolicy,
        LocalCacheAwarePolicy,
        GlobalCacheAwarePolicy,
    )
}


def make_prefill_policy(name: str, **params: object) -> PrefillPolicy:
    """``make_prefill_policy("global-cache-aware", threshold=2.0)``; raises ``ConfigError`` for an
    unknown name or parameter."""
    return make_named("prefill policy", PREFILL_POLICIES, name, params)
