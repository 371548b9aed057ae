"""Batch bookkeeping: jobs (coalesced requests), their slices, and per-request outcomes.

A *job* is one or more contiguous requests merged into a single range; it is cut into slices
that transports execute in any order, possibly on several connections and, after a path
failure, more than once (reads and writes of the same bytes are idempotent, so a retried slice
is harmless). A job is done when all its slices are; its outcome is copied to every member.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvcake.core.ids import BatchId
from kvcake.transfer.types import (
    BatchResult,
    BatchStatus,
    Landed,
    Op,
    RequestResult,
    SegmentInfo,
)


@dataclass(eq=False, slots=True)
class Job:
    op: Op
    local: memoryview  # exactly ``length`` bytes of initiator memory
    target: SegmentInfo
    target_offset: int
    length: int
    members: list[int]
    batch: Batch | None = None
    remaining: int = 0
    error: BaseException | None = None
    landed: Landed | None = None  # a read's progress, in offsets of ``local`` (types.Landed)
    fence: int = 0  # a write's allocation (transfer/fences.py); 0 = not fenced


@dataclass(eq=False, slots=True)
class Slice:
    job: Job
    offset: int  # within the job
    length: int
    attempts: int = 0

    @property
    def target_offset(self) -> int:
        return self.job.target_offset + self.offset

    @property
    def local(self) -> memoryview:
        job = self.job
        if self.length == job.length:  # the whole job (one slice): its view as it is
            return job.local
        return job.local[self.offset : self.offset + self.length]


OK = RequestResult(True)


def failure(exc: BaseException) -> RequestResult:
    """The outcome of a request that failed with ``exc`` (its message and type name)."""
    return RequestResult(False, str(exc), type(exc).__name__)


def cut(job: Job, slice_size: int) -> list[Slice]:
    if job.length <= slice_size:
        job.remaining = 1
        return [Slice(job, 0, job.length)]
    out = [
        Slice(job, off, min(slice_size, job.length - off))
        for off in range(0, job.length, slice_size)
    ]
    job.remaining = len(out)
    return out


class Claimable:
    """A task that runs at most once, by whichever thread claims it first (a worker, or the
    thread that waits for the batch: it helps instead of sleeping, saving a thread hand-off)."""

    def __init__(self, fn: Callable[[], None]):
        self._fn = fn
        self._claim = threading.Lock()

    def __call__(self) -> None:
        if self._claim.acquire(blocking=False):
            self._fn()


@dataclass(eq=False)
class Batch:
    id: BatchId
    size: int
    results: list[RequestResult | None] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    completed: int = 0
    failed: int = 0
    tasks: list[Claimable] = field(default_factory=list)
    done_at: float = 0.0  # monotonic time the last outcome arrived (0: not yet)

    def help(self) -> None:
        """Run every task of this batch that no worker has started yet, in this thread."""
        for t in self.tasks:
            t()

    def __post_init__(self) -> None:
        self.results = [None] * self.size
        if self.size == 0:
            self.done_at = time.monotonic()

    def fail_request(self, index: int, exc: BaseException) -> None:
        with self.cond:
            self._set(index, failure(exc))
            self.cond.notify_all()

    def settle_all(self, results: Sequence[RequestResult]) -> None:
        """Every request's outcome at once (a batch run as one frame): one lock, one wake-up.
        Outcomes already recorded stay."""
        with self.cond:
            for i, res in enumerate(results):
                self._set(i, res)
            self.cond.notify_all()

    def _set(self, index: int, res: RequestResult) -> None:
        if self.results[index] is not None:
            return
        self.results[index] = res
        if res.ok:
            self.completed += 1
        else:
            self.failed += 1
        if self.completed + self.failed == self.size:
            self.done_at = time.monotonic()

    def slice_done(self, s: Slice, exc: BaseException | None = None) -> None:
        """Record one slice's outcome; finishing the last slice settles the job's members."""
        with self.cond:
            if self._settle(s, exc):
                self.cond.notify_all()

    def slices_done(self, outcomes: Sequence[tuple[Slice, BaseException | None]]) -> None:
        """:meth:`slice_done` for a whole reply's slices: one lock, one wake-up."""
        with self.cond:
            settled = False
            for s, exc in outcomes:
                settled = self._settle(s, exc) or settled
            if settled:
                self.cond.notify_all()

    def _settle(self, s: Slice, exc: BaseException | None) -> bool:
        job = s.job
        if exc is not None and job.error is None:
            job.error = exc
        job.remaining -= 1
        if job.remaining > 0:
            return False
        res = OK if job.error is None else failure(job.error)
        for i in job.members:
            self._set(i, res)
        return True

    @property
    def done(self) -> bool:
        return self.completed + self.failed == self.size

    def status(self) -> BatchStatus:
        with self.cond:
            return BatchStatus(self.id, self.size, self.completed, self.failed)

    def wait(self, timeout: float | None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.done, timeout)

    def result(self) -> BatchResult:
        with self.cond:
            assert self.done
            return BatchResult(self.id, tuple(r for r in self.results if r is not None))


class SliceQueue:
    """Slices striped over lanes (slice i -> lane i mod n, so every lane and hence every path
    gets work); a lane whose own share is done and has nothing in flight steals one slice from
    the back of the fullest other."""

    def __init__(self, slices: list[Slice], lanes: int):
        self._qs = [collections.deque(slices[i::lanes]) for i in range(lanes)]
        self._started = [False] * lanes
        self._lock = threading.Lock()

    def pop(self, lane: int, steal: bool = True) -> Slice | None:
        with self._lock:
            self._started[lane] = True
            own = self._qs[lane]
            if own:
                return own.popleft()
            if not steal:
                return None
            # Only lanes that run are robbed, so every lane (and its path) gets its first slices
            # even when another lane's thread happened to start much earlier.
            started = [q for q, st in zip(self._qs, self._started, strict=True) if st]
            victim = max(started, key=len)
            return victim.pop() if victim else None

    def take(self, lane: int, count: int, max_bytes: int, steal: bool) -> list[Slice]:
        """Up to ``count`` slices (and about ``max_bytes``) of this lane's own share under one
        lock; with ``steal`` and an empty share, one slice stolen as :meth:`pop` does."""
        with self._lock:
            self._started[lane] = True
            own = self._qs[lane]
            if own:
                out: list[Slice] = []
                size = 0
                while own and len(out) < count and size < max_bytes:
                    s = own.popleft()
                    out.append(s)
                    size += s.length
                return out
        if not steal:
            return []
        stolen = self.pop(lane, steal=True)
        return [stolen] if stolen is not None else []

    def push_front(self, lane: int, slices: list[Slice]) -> None:
        with self._lock:
            self._qs[lane].extendleft(reversed(slices))

    def drain(self) -> list[Slice]:
        with self._lock:
            out = [s for q in self._qs for s in q]
            for q in self._qs:
                q.clear()
            return out

    def __bool__(self) -> bool:
        return any(self._qs)
