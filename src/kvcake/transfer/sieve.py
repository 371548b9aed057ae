"""SIEVE eviction (Zhang et al., NSDI'24), as the paper uses for idle endpoints.

Entries sit in insertion order (newest at the head). Each hit sets a *visited* bit. To evict,
a hand walks from the tail towards the head (wrapping): a visited entry has its bit cleared and
survives; the first unvisited entry the caller allows (``evictable``) is evicted; the hand stays
where it stopped. Pure logic, not thread-safe: the owner locks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Sieve(Generic[K]):
    def __init__(self) -> None:
        self._order: list[K] = []  # index 0 = tail (oldest), last = head (newest)
        self._visited: dict[K, bool] = {}
        self._hand = 0

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._visited

    def insert(self, key: K) -> None:
        if key in self._visited:
            raise KeyError(f"{key!r} already present")
        self._order.append(key)
        self._visited[key] = False

    def touch(self, key: K) -> None:
        if key in self._visited:
            self._visited[key] = True

    def remove(self, key: K) -> None:
        i = self._order.index(key)
        del self._order[i]
        del self._visited[key]
        if i < self._hand:
            self._hand -= 1
        if self._hand >= len(self._order):
            self._hand = 0

    def evict(self, evictable: Callable[[K], bool] = lambda _k: True) -> K | None:
        """Pick and remove a victim; ``None`` when no entry is evictable."""
        n = len(self._order)
        # Two full sweeps suffice: the first clears every visited bit it passes.
        for _ in range(2 * n):
            if self._hand >= len(self._order):
                self._hand = 0
            key = self._order[self._hand]
            if self._visited[key]:
                self._visited[key] = False
            elif evictable(key):
                self.remove(key)
                return key
            self._hand += 1
        return None
