"""The group commit hands each durable request's reply to the committing thread
(``wait(on_commit=...)``): run exactly once, only once durable, never after its request thread
gave up, and never on a failed log. A controllable in-memory backend stands for the storage
(pure logic of :class:`GroupCommitLog`); the durable master's path over a real socket and a
real file log is at the end; the whole master path (real processes, etcd) is
``test_failover.py``."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from kvcake.store import protocol as P
from kvcake.store.ha.durable import Durable
from kvcake.store.ha.filelog import FileOpLog
from kvcake.store.ha.oplog import GroupCommitLog, LogFailed
from kvcake.store.ha.view import ObjRec, Record, Snapshot


class GatedLog(GroupCommitLog):
    """Entries become durable when the test opens ``gate``; ``broken`` makes writes fail."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.broken = False
        self.entries: list[tuple[int, list[Record]]] = []
        self.writer_threads: set[str] = set()

    def _read_all(self) -> tuple[Snapshot | None, list[tuple[int, list[Record]]]]:
        return None, []

    def _write_entry(self, number: int, records: list[Record]) -> None:
        self.writer_threads.add(threading.current_thread().name)
        assert self.gate.wait(10)
        if self.broken:
            raise OSError("storage gone")
        self.entries.append((number, records))

    def _write_snapshot(self, snap: Snapshot) -> None:
        pass


def _rec(i: int) -> ObjRec:
    return ObjRec(f"k{i}", 100, False, [("seg", i * 128, "memory")])


@pytest.fixture
def oplog() -> GatedLog:
    log = GatedLog()
    log.load()
    yield log
    log.gate.set()
    log.close()


def test_on_commit_runs_once_on_the_committing_thread_before_wait_returns(
    oplog: GatedLog,
) -> None:
    ran: list[str] = []
    ticket = oplog.append([_rec(1)])
    assert oplog.wait(ticket, on_commit=lambda: ran.append(threading.current_thread().name))
    assert len(ran) == 1 and ran[0].startswith("oplog-write")
    assert oplog.committed >= ticket
    # Already durable: nothing is run for the caller, it answers itself.
    assert oplog.wait(ticket, on_commit=lambda: ran.append("again")) is False
    assert ran[1:] == []


def test_many_threads_each_reply_exactly_once_in_durable_order(oplog: GatedLog) -> None:
    sent: list[int] = []
    lock = threading.Lock()

    def request(i: int) -> None:
        for j in range(20):
            ticket = oplog.append([_rec(i * 100 + j)])

            def on_commit(t: int = ticket) -> None:
                assert oplog.committed >= t  # never before the records are durable
                with lock:
                    sent.append(t)

            assert oplog.wait(ticket, on_commit=on_commit)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(sent) == sorted(set(sent)) and len(sent) == 160
    written = [r.key for _, recs in oplog.entries for r in recs]
    assert sorted(written) == sorted(f"k{i * 100 + j}" for i in range(8) for j in range(20))
    assert len(oplog.entries) < 160  # group commit: several requests per entry


def test_a_failing_on_commit_leaves_the_reply_to_the_request_thread(oplog: GatedLog) -> None:
    def broken() -> None:
        raise OSError("peer reset")

    assert oplog.wait(oplog.append([_rec(1)]), on_commit=broken) is False


def test_a_request_that_timed_out_is_never_answered_by_the_committer(oplog: GatedLog) -> None:
    ran: list[int] = []
    oplog.gate.clear()  # the write hangs (a slow etcd)
    ticket = oplog.append([_rec(1)])
    with pytest.raises(LogFailed, match="not durable"):
        oplog.wait(ticket, timeout_s=0.2, on_commit=lambda: ran.append(1))
    oplog.gate.set()
    oplog.wait(oplog.append([_rec(2)]))
    assert oplog.committed >= ticket and ran == []  # its thread answered: nobody else may


def test_a_failed_write_answers_nobody_and_fails_every_waiter(oplog: GatedLog) -> None:
    ran: list[int] = []
    oplog.gate.clear()
    oplog.broken = True
    ticket = oplog.append([_rec(1)])
    errors: list[Exception] = []

    def request() -> None:
        try:
            oplog.wait(ticket, on_commit=lambda: ran.append(1))
        except LogFailed as exc:
            errors.append(exc)

    t = threading.Thread(target=request)
    t.start()
    time.sleep(0.05)
    oplog.gate.set()
    t.join(10)
    assert ran == [] and len(errors) == 1
    with pytest.raises(LogFailed):
        oplog.append([_rec(2)])


def test_the_writer_keeps_its_slot_while_records_come(oplog: GatedLog) -> None:
    """Records that arrive while a write is in flight go out together in the next entry,
    from the writer's own thread (the pool has one: depth 1)."""
    oplog.gate.clear()
    first = oplog.append([_rec(0)])
    time.sleep(0.05)
    tickets = [oplog.append([_rec(i)]) for i in range(1, 10)]
    oplog.gate.set()
    oplog.wait(first)
    for t in tickets:
        oplog.wait(t)
    assert len(oplog.entries) == 2  # the first, then everything queued behind it
    assert len(oplog.writer_threads) == 1


def test_durable_reply_is_sent_once_over_a_real_socket(tmp_path: Path) -> None:
    """``Durable.finish`` with a real file log: the reply frame arrives exactly once, sent by
    the committing thread; a log that failed answers with RpcFailed instead."""
    log = FileOpLog(tmp_path)
    log.load()
    a, b = socket.socketpair()
    sent: list[str] = []

    def send(reply: object) -> None:
        sent.append(threading.current_thread().name)
        a.sendall(b"R")

    try:
        out = Durable(log, log.append([_rec(1)]), P.Reply()).finish(send)
        assert out is None and len(sent) == 1 and sent[0].startswith("oplog-write")
        b.settimeout(2)
        assert b.recv(16) == b"R"
        log.fail(OSError("disk gone"))
        out = Durable(log, log.appended + 1, P.Reply()).finish(send)
        assert isinstance(out, P.Reply) and out.code == -900 and len(sent) == 1
    finally:
        a.close()
        b.close()
        log.close()
