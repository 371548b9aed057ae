"""The group commit's writer (pure logic of :class:`GroupCommitLog`, a controllable in-memory
backend standing for the storage): waiters wake only once durable and the writer keeps its slot
while records come. Timeouts and failed writes are tested with the replies, in
``test_commit_replies.py``; the whole master path (real processes, etcd) is ``test_failover.py``."""

from __future__ import annotations

import threading
import time

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
