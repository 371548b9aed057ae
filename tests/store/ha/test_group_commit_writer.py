"""The group commit's writer (pure logic of :class:`GroupCommitLog`, a controllable in-memory
backend standing for the storage): waiters wake only once durable and the writer keeps its slot
while records come. Timeouts and failed writes are tested with the replies, in
``test_commit_replies.py``; the whole master path (real processes, etcd) is ``test_failover.py``."""

from __future__ import annotations

import threading
import time

import pytest

from kvcake.store.ha import oplog as oplog_module
from kvcake.store.ha.oplog import LogFailed
from tests.store.ha.gated import GatedLog, rec


def test_many_threads_each_wait_only_until_durable(oplog: GatedLog) -> None:
    done: list[int] = []
    lock = threading.Lock()

    def request(i: int) -> None:
        for j in range(20):
            ticket = oplog.append([rec(i * 100 + j)])
            oplog.wait(ticket)
            assert oplog.committed >= ticket  # never woken before the records are durable
            with lock:
                done.append(ticket)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(done) == 160 and len(set(done)) == 160
    written = [r.key for _, recs in oplog.entries for r in recs]
    assert sorted(written) == sorted(f"k{i * 100 + j}" for i in range(8) for j in range(20))
    assert [n for n, _ in oplog.entries] == list(range(1, len(oplog.entries) + 1))
    assert len(oplog.entries) < 160  # group commit: several requests per entry


def test_the_writer_keeps_its_slot_while_records_come(oplog: GatedLog) -> None:
    """Records that arrive while a write is in flight go out together in the next entry,
    written by the same writer thread (the pool has one: depth 1)."""
    oplog.gate.clear()
    first = oplog.append([rec(0)])
    time.sleep(0.05)
    tickets = [oplog.append([rec(i)]) for i in range(1, 10)]
    oplog.gate.set()
    oplog.wait(first)
    for t in tickets:
        oplog.wait(t)
    assert len(oplog.entries) == 2  # the first, then everything queued behind it
    assert len(oplog.writer_threads) == 1


def test_records_after_the_linger_are_still_written(oplog: GatedLog) -> None:
    """A writer that gave its slot back (nothing came within the linger) is replaced by the
    committer for the next records: nothing is left pending."""
    oplog.wait(oplog.append([rec(0)]))
    time.sleep(0.05)  # well past the writer's linger
    oplog.wait(oplog.append([rec(1)]), timeout_s=5)
    assert [len(r) for _, r in oplog.entries] == [1, 1]


def _gathering(delay_s: float, monkeypatch: pytest.MonkeyPatch) -> GatedLog:
    # A writer with nothing pending waits this long for the next request before it gives its
    # slot back; long here, so a slow thread wake-up (a loaded CI machine) cannot hand the next
    # request to the committer thread instead and make the test's entry sizes timing-dependent.
    monkeypatch.setattr(oplog_module, "LINGER_S", 5.0)
    log = GatedLog(commit_delay_s=delay_s, commit_siblings=2)
    log.load()
    return log


def test_a_busy_log_gathers_whole_groups_and_a_lone_client_never_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """commit_delay / commit_siblings: after an entry of >= 2 requests the writer waits (up
    to the delay) for as many requests as that entry had, so 8 clients that each come back
    at their own pace still share one entry; one client alone is never delayed."""
    log = _gathering(5.0, monkeypatch)
    try:
        log.gate.clear()
        first = log.append([rec(0)])
        time.sleep(0.05)  # entry 1 is in flight; 8 requests queue behind it
        tickets = [log.append([rec(i)]) for i in range(1, 9)]
        log.gate.set()
        log.wait(first)

        def again(i: int, ticket: int) -> None:
            log.wait(ticket)
            time.sleep(0.01 * i)  # the clients come back one after the other
            log.wait(log.append([rec(100 + i)]))

        threads = [threading.Thread(target=again, args=(i, t)) for i, t in enumerate(tickets)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert [len(r) for _, r in log.entries] == [1, 8, 8]  # not trickled out one by one
    finally:
        log.close()
    lone = _gathering(5.0, monkeypatch)
    try:
        t0 = time.monotonic()
        for i in range(5):
            lone.wait(lone.append([rec(i)]), timeout_s=10)
        assert time.monotonic() - t0 < 2.5  # one delay would be 5 s
    finally:
        lone.close()


def test_a_gathering_writer_stops_waiting_when_the_log_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = _gathering(30.0, monkeypatch)
    try:
        log.gate.clear()
        first = log.append([rec(0)])
        time.sleep(0.05)
        tickets = [log.append([rec(i)]) for i in range(1, 4)]  # the next entry: 3 requests
        log.gate.set()
        for t in (first, *tickets):
            log.wait(t)
        ticket = log.append([rec(99)])  # 1 of the 3 the writer now gathers for, up to 30 s
        time.sleep(0.1)
        assert log.committed < ticket
        log.fail(OSError("storage gone"))
        with pytest.raises(LogFailed):
            log.wait(ticket, timeout_s=5)
        t0 = time.monotonic()
        log.close()  # the writer left its 30 s wait: the log's threads end at once
        assert time.monotonic() - t0 < 5
        assert not log._thread.is_alive()
    finally:
        log.close()
