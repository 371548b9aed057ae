"""Transports move a group of jobs bound for one owner. The engine picks one per target from
a small registry (``auto``: the first whose ``usable`` says yes, in registry order; a forced
protocol names one)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from kvcake.transfer.batch import Batch, Job
from kvcake.transfer.types import Landed, Op, SegmentInfo

Task = Callable[[], None]


class Transport(ABC):
    """Invariant: every slice of every job handed to ``tasks`` is eventually reported exactly
    once through ``Batch.slice_done`` (success or error) by the returned tasks, even when they
    fail; tasks never raise."""

    name: str

    @abstractmethod
    def usable(self, target: SegmentInfo) -> bool:
        """Can this transport reach ``target`` from here?"""

    @abstractmethod
    def tasks(self, batch: Batch, jobs: list[Job]) -> list[Task]:
        """Callables that together execute ``jobs`` (run on worker threads or inline)."""

    def run_single(
        self,
        op: Op,
        local: memoryview,
        target: SegmentInfo,
        offset: int,
        landed: Landed | None = None,
        fence: int = 0,
    ) -> bool:
        """One request in the caller's thread without batch bookkeeping, if this transport
        has such a path for it; False: take the general path (which also reports errors).
        ``landed``: see ``types.Landed`` (a transport may ignore it); ``fence``: a write's
        allocation (transfer/fences.py; a transport without a server in between ignores it)."""
        return False

    def close(self) -> None:  # noqa: B027  (optional hook)
        """Release transport resources (mappings, connections)."""
