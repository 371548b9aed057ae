"""The operation log: an ABC and the group-commit machinery its backends share.

Invariants (every backend):
- ``append`` never blocks on I/O; it returns a ticket (the number of records appended so far).
- Records become durable in append order; ``wait(ticket)`` returns only once every record up
  to ``ticket`` is durable, and raises :class:`LogFailed` if that can no longer happen.
- A failed log stays failed (a fenced or broken master must step down, not limp on): every
  later ``append``/``wait`` raises.
- ``load`` (once, before the first append) returns the durable view: the last snapshot plus
  every entry after it. A torn tail (crash in the middle of a write) is dropped, not an error.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kvcake.core.errors import KvcakeError
from kvcake.store.ha.view import Record, Snapshot, View

log = logging.getLogger(__name__)
LINGER_S = 0.002  # a writer waits this long for more records before it gives its slot back
MAX_ENTRY_RECORDS = 2048  # one log entry (one etcd txn / one file frame) stays well under 1 MiB
SNAPSHOT_BYTES = 8 << 20  # also snapshot after this many logged bytes (ha.snapshot_bytes)
GROUP_HISTORY = 64  # entries whose group sizes bound how many requests a gathering writer awaits


class LogFailed(KvcakeError):
    """The log cannot make a record durable (fenced by a new leader, storage broken)."""


class _Waiter:
    """A request thread blocked in :meth:`GroupCommitLog.wait`. ``claimed`` (set under the
    log's condition) means a committing thread took it and will run ``on_commit`` and then
    ``wake`` it; ``gone`` means its thread stopped waiting, so nobody runs ``on_commit``."""

    __slots__ = ("claimed", "gone", "lock", "on_commit")

    def __init__(self, on_commit: Callable[[], None] | None):
        self.lock = threading.Lock()
        self.lock.acquire()
        self.on_commit = on_commit
        self.claimed = self.gone = False

    def committed(self) -> None:
        """Run ``on_commit`` (on the committing thread)."""
        if self.on_commit is not None and not self.gone:
            try:
                self.on_commit()
            except Exception:  # must not cost the writer; the waiting thread still answers
                log.exception("operation log: on_commit failed")

    def wake(self) -> None:
        self.lock.release()


Job = tuple[int, list[Record], int]  # (entry number, records, ticket at its end)


class OpLog(ABC):
    @abstractmethod
    def load(self) -> View:
        """Snapshot + entries after it; positions the log after the last entry."""

    @abstractmethod
    def append(self, records: list[Record]) -> int:
        """Queue ``records``; returns the ticket to :meth:`wait` for."""

    @abstractmethod
    def wait(
        self, ticket: int, timeout_s: float = 30.0, on_commit: Callable[[], None] | None = None
    ) -> None:
        """Block until records up to ``ticket`` are durable; raise LogFailed otherwise.
        ``on_commit`` (optional) may be run by the committing thread the moment they are
        durable, before this returns; it runs at most once, never on a failed log, and never
        after this raised (a timed-out caller answers for itself). It must not block."""

    @property
    @abstractmethod
    def appended(self) -> int:
        """Ticket of the last appended record."""

    @abstractmethod
    def close(self) -> None: ...


class GroupCommitLog(OpLog):
    """A committer thread writes everything queued since its last write as ONE entry (up to
    ``MAX_ENTRY_RECORDS``): concurrent requests share one fsync / etcd transaction. Every
    ``snapshot_every`` records it writes a snapshot of the view and drops the entries it covers.
    ``source`` (optional) is polled when idle so that housekeeping changes get logged too."""

    def __init__(
        self,
        snapshot_every: int = 20_000,
        depth: int = 1,
        commit_delay_s: float = 0.0,
        commit_siblings: int = 4,
    ):
        self.snapshot_every = snapshot_every
        self.depth = depth  # concurrent entry writes (1: strictly one after the other)
        # Gathering (PostgreSQL's commit_delay / commit_siblings): when the last entry carried
        # at least ``commit_siblings`` requests, the writer waits up to ``commit_delay_s`` for
        # as many requests as the largest recent entry had before it writes the next one. A
        # request of a busy master then shares its storage write with more others (fewer,
        # fuller etcd transactions: less of the CPU that the clients and the master share with
        # etcd); a lone client never waits.
        self.commit_delay_s = commit_delay_s
        self.commit_siblings = commit_siblings
        self._groups: collections.deque[int] = collections.deque([0], maxlen=GROUP_HISTORY)
        self._pending_requests = 0  # appends since the last batch was taken
        self._want = 1  # a lingering writer is woken once this many requests are pending
        self.view = View()
        self.source: Callable[[], object] | None = None
        self.on_failure: Callable[[Exception], None] | None = None
        # The committer's condition: only the committer thread waits on it (for records, or a
        # free write slot). Request threads wait on a lock of their own, released when their
        # ticket is committed: a notify_all on every append and commit woke every waiting
        # request thread each time (16 clients: a quarter of a durable master's GIL time).
        lock = threading.Lock()
        self._cv = threading.Condition(lock)
        self._more = threading.Condition(lock)  # a lingering writer waits here (_next_job)
        self._lingering = 0
        self._waiters: list[tuple[int, int, _Waiter]] = []  # heap of (ticket, n, waiter)
        self._wseq = itertools.count()
        self._pending: list[Record] = []
        self._appended = 0
        self._committed = 0
        self._entry = 0  # number of the last entry dispatched
        self._next = 1  # the next entry to commit (entries finish out of order with depth > 1)
        self._done: dict[int, tuple[list[Record], int]] = {}
        self._inflight = 0
        self._dispatched = 0  # ticket at the end of the last dispatched batch
        self._snapshotting = False
        self._since_snapshot = 0
        # A snapshot also once the entries since the last one hold this many bytes: a record
        # that grows (a segment's held ranges while its puts keep failing) made every entry
        # larger, and a take-over then read hundreds of MB (docs/benchmarks.md, "Nemesis").
        self.snapshot_bytes = SNAPSHOT_BYTES
        self._since_bytes = 0
        self._failed: Exception | None = None
        self.entries_written = 0  # statistics: entries, and seconds spent writing them
        self.write_s = 0.0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="oplog-commit", daemon=True)

    # --- backend ------------------------------------------------------------------------------

    @abstractmethod
    def _read_all(self) -> tuple[Snapshot | None, list[tuple[int, list[Record]]], int]:
        """The stored snapshot, the entries (number, records) in order, and their bytes."""

    @abstractmethod
    def _write_entry(self, number: int, records: list[Record]) -> int:
        """Make one entry durable (raise LogFailed if fenced, another error if transient);
        returns its size in bytes."""

    @abstractmethod
    def _write_snapshot(self, snap: Snapshot) -> None:
        """Store ``snap`` and drop the entries up to ``snap.seq``."""

    def _truncate(self, first: int) -> None:
        """Drop every stored entry numbered ``first`` or more (after a hole)."""
        raise LogFailed(f"operation log: entries after a hole at {first} cannot be dropped")

    # --- OpLog ---------------------------------------------------------------------------------

    def load(self) -> View:
        snap, entries, self._since_bytes = self._read_all()
        self.view = View.of(snap) if snap is not None else View()
        self._entry = self.view.seq
        for number, records in entries:
            if number <= self.view.seq:
                continue
            if number != self._entry + 1:  # a hole: entries after it were never acknowledged
                log.warning(
                    "operation log: entry %d missing; dropping the later ones", self._entry + 1
                )
                self._truncate(self._entry + 1)
                break
            self.view.apply_all(number, records)
            self._entry = number
            self._since_snapshot += len(records)
        self._next = self._entry + 1
        self._thread.start()
        return self.view

    @property
    def appended(self) -> int:
        return self._appended

    @property
    def committed(self) -> int:
        return self._committed

    def append(self, records: list[Record]) -> int:
        with self._cv:
            if self._failed is not None:
                raise LogFailed(f"operation log failed: {self._failed}")
            self._pending.extend(records)
            self._appended += len(records)
            self._pending_requests += 1
            if self._lingering:
                if self._pending_requests >= self._want:
                    self._more.notify()
            elif self._inflight < self.depth:  # else a writer takes them when it finishes
                self._cv.notify()
            return self._appended

    def wait(
        self, ticket: int, timeout_s: float = 30.0, on_commit: Callable[[], None] | None = None
    ) -> None:
        with self._cv:
            if self._committed >= ticket:
                return
            if self._failed is not None:
                raise LogFailed(f"operation log failed: {self._failed}")
            waiter = _Waiter(on_commit)
            heapq.heappush(self._waiters, (ticket, next(self._wseq), waiter))
        # Released by the committing thread (after on_commit) or by fail; a timed-out entry
        # stays in the heap until the commit that passes it releases it unseen.
        if not waiter.lock.acquire(timeout=timeout_s):
            with self._cv:
                waiter.gone = not waiter.claimed
            if not waiter.gone:  # being finished right now: its on_commit may be running
                waiter.lock.acquire()
        with self._cv:
            if self._committed >= ticket:
                return
            if self._failed is not None:
                raise LogFailed(f"operation log failed: {self._failed}")
        raise LogFailed(f"operation log: record {ticket} not durable in {timeout_s}s")

    def _claim_committed(self) -> list[_Waiter]:
        """Take the waiters whose tickets are now durable (caller holds ``_cv``); the caller
        finishes them after releasing ``_cv``: their ``on_commit`` sends replies, and appends
        by other request threads must not wait for that."""
        waiters, committed = self._waiters, self._committed
        out = []
        while waiters and waiters[0][0] <= committed:
            waiter = heapq.heappop(waiters)[2]
            waiter.claimed = True
            out.append(waiter)
        return out

    def fail(self, exc: Exception) -> None:
        with self._cv:
            if self._failed is None:
                self._failed = exc
            for _ticket, _n, waiter in self._waiters:
                waiter.wake()
            self._waiters.clear()
            self._cv.notify_all()
            self._more.notify_all()  # a gathering writer stops waiting
        if self.on_failure is not None:
            self.on_failure(exc)

    def _run(self) -> None:
        """Dispatch batches to up to ``depth`` concurrent writes (etcd batches concurrent
        proposals into one fsync of its own); entries become committed in number order."""
        writers = ThreadPoolExecutor(self.depth, thread_name_prefix="oplog-write")
        try:
            while True:
                with self._cv:
                    if self._failed is not None:
                        return
                    if self._closed and not self._pending and not self._inflight:
                        return
                    if not self._pending or self._inflight >= self.depth:
                        idle = not self._pending and not self._inflight
                        self._cv.wait(0.05)
                        job = None
                    else:
                        self._inflight += 1
                        job = self._take_batch()
                if job is not None:
                    writers.submit(self._write_loop, *job)
                elif idle:
                    self._poll_source()
        finally:
            writers.shutdown(wait=True)

    def _take_batch(self) -> Job:
        """The next entry: everything pending, up to ``MAX_ENTRY_RECORDS`` (caller holds
        ``_cv`` and owns a write slot)."""
        batch = self._pending[:MAX_ENTRY_RECORDS]
        del self._pending[: len(batch)]
        self._groups.append(self._pending_requests)
        self._pending_requests = 0 if not self._pending else 1  # an over-long batch: the rest
        self._entry += 1
        self._dispatched += len(batch)
        return self._entry, batch, self._dispatched

    def _write_loop(self, number: int, batch: list[Record], end: int) -> None:
        """Write entries while records come, keeping this write slot. Handing each next batch
        back to the committer thread cost a wake-up of it and of a writer between two etcd
        transactions: ~0.9 ms at p50 with 16 writing clients on 2 vCPUs, against ~1.5 ms for
        the transaction itself (docs/benchmarks.md, "Store HA")."""
        job: Job | None = (number, batch, end)
        while job is not None:
            job = self._write_one(job)

    def _write_one(self, job: Job) -> Job | None:
        """Write one entry, commit what is now in order and finish its waiters (their replies
        go out from this thread); the next job for this slot, or ``None`` (slot given back)."""
        number, batch, end = job
        t0 = time.perf_counter()
        try:
            nbytes = self._write_entry(number, batch)
        except Exception as exc:
            log.error("operation log: write failed, stepping down: %s", exc)
            self.fail(exc)
            return None
        snap = None
        with self._cv:
            self.entries_written += 1
            self.write_s += time.perf_counter() - t0
            self._since_bytes += nbytes
            self._done[number] = (batch, end)
            while self._next in self._done:  # commit in order, whatever finished first
                done, ticket = self._done.pop(self._next)
                self.view.apply_all(self._next, done)
                self._committed = ticket
                self._since_snapshot += len(done)
                self._next += 1
            woken = self._claim_committed()
            due = self._since_snapshot >= self.snapshot_every
            if (due or self._since_bytes >= self.snapshot_bytes) and not self._snapshotting:
                self._snapshotting = True
                snap = self.view.snapshot()
        # Every reply first, then the wake-ups: a request thread woken early competes with
        # this one for the GIL while the other replies wait (8 waiters per commit under 16
        # clients: the replies took 0.6-0.8 ms at p50 interleaved, 0.3-0.4 ms so).
        for waiter in woken:
            waiter.committed()
        for waiter in woken:
            waiter.wake()
        if snap is not None:
            self._give_back_slot()
            self._snapshot(snap)
            return None
        return self._next_job()

    def _next_job(self) -> Job | None:
        """The next batch for this writer's slot: what is pending, else what arrives within
        ``LINGER_S`` (the replies just sent bring their clients' next records back soon;
        a hand-off to the committer thread and a writer costs two wake-ups, ~0.7 ms at p50
        under 16 writing clients on 2 vCPUs); ``None`` gives the slot back."""
        with self._cv:
            if not self._pending and self._failed is None and not self._closed:
                self._linger(1, LINGER_S)
            if self.commit_delay_s and self._pending and self._groups[-1] >= self.commit_siblings:
                self._linger(max(self._groups), self.commit_delay_s)
            if self._pending and self._failed is None:
                return self._take_batch()
            self._free_slot()
            return None

    def _linger(self, requests: int, timeout_s: float) -> None:
        """Wait until ``requests`` requests are pending, at most ``timeout_s`` (caller holds
        ``_cv``; appends wake it)."""
        deadline = time.monotonic() + timeout_s
        self._lingering += 1
        self._want = requests
        try:
            while self._pending_requests < requests and self._failed is None and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._more.wait(left)
        finally:
            self._lingering -= 1

    def _give_back_slot(self) -> None:
        with self._cv:
            self._free_slot()

    def _free_slot(self) -> None:
        """A write slot is free: the committer may dispatch (caller holds ``_cv``)."""
        self._inflight -= 1
        self._cv.notify()

    def _poll_source(self) -> None:
        if self.source is None:
            return
        try:
            self.source()
        except LogFailed:
            pass
        except Exception:
            log.exception("operation log: source poll failed")

    def _snapshot(self, snap: Snapshot) -> None:
        try:
            self._write_snapshot(snap)
            with self._cv:
                self._since_snapshot = self._since_bytes = 0
        except LogFailed as exc:
            self.fail(exc)
        except Exception:  # the log itself is intact: try again after more entries
            log.exception("operation log: snapshot failed")
            with self._cv:
                self._since_snapshot = self.snapshot_every // 2
                self._since_bytes = self.snapshot_bytes // 2
        finally:
            self._snapshotting = False

    def snapshot_now(self) -> None:
        """Write a snapshot at once (tests, clean shutdown); waits for pending entries first."""
        self.wait(self.appended)
        with self._cv:
            self._write_snapshot(self.view.snapshot())
            self._since_snapshot = self._since_bytes = 0

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            self._more.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.entries_written:
            log.warning(
                "oplog: %d records in %d entries (%.1f per entry), %.2f ms per write",
                self._committed,
                self.entries_written,
                self._committed / self.entries_written,
                1000 * self.write_s / self.entries_written,
            )
