"""The group commit hands each durable request's reply to the committing thread
(``wait(on_commit=...)``): run at most once, only once durable, never after its request thread
gave up, and never on a failed log. The send it does (:class:`ReplySender`) never blocks the
committing thread, even on a client that stopped reading. A controllable in-memory backend
stands for the storage (pure logic); the durable master's path over a real socket and a real
file log is at the end; the whole master path (real processes, etcd) is ``test_failover.py``."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from kvcake.store import protocol as P
from kvcake.store.deferred_reply import ReplySender
from kvcake.store.ha.durable import Durable
from kvcake.store.ha.filelog import FileOpLog
from kvcake.store.ha.oplog import LogFailed
from kvcake.store.rpc import BufferedFrames
from tests.store.ha.gated import GatedLog, rec
from tests.waits import wait_until


def test_on_commit_runs_once_on_the_committing_thread_before_wait_returns(
    oplog: GatedLog,
) -> None:
    ran: list[str] = []
    ticket = oplog.append([rec(1)])
    oplog.wait(ticket, on_commit=lambda: ran.append(threading.current_thread().name))
    assert len(ran) == 1 and ran[0].startswith("oplog-write")
    assert oplog.committed >= ticket
    # Already durable: nothing is run for the caller, it answers itself.
    oplog.wait(ticket, on_commit=lambda: ran.append("again"))
    assert ran[1:] == []


def test_many_threads_each_answered_exactly_once_and_only_when_durable(
    oplog: GatedLog,
) -> None:
    by_writer: list[int] = []
    by_self: list[int] = []
    lock = threading.Lock()

    def request(i: int) -> None:
        for j in range(20):
            ticket = oplog.append([rec(i * 100 + j)])
            ran: list[int] = []

            def on_commit(t: int = ticket, ran: list[int] = ran) -> None:
                assert oplog.committed >= t  # never before the records are durable
                ran.append(t)

            oplog.wait(ticket, on_commit=on_commit)
            with lock:  # its writer answered, or (already durable at wait) the thread itself
                (by_writer if ran else by_self).append(ticket)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    answered = by_writer + by_self
    assert len(answered) == 160 and len(set(answered)) == 160
    assert by_writer  # the committing thread answered at least some of them
    written = [r.key for _, recs in oplog.entries for r in recs]
    assert sorted(written) == sorted(f"k{i * 100 + j}" for i in range(8) for j in range(20))
    assert len(oplog.entries) < 160  # group commit: several requests per entry


def test_a_failing_on_commit_still_wakes_its_thread(oplog: GatedLog) -> None:
    def broken() -> None:
        raise RuntimeError("a bug in the reply path")

    oplog.wait(oplog.append([rec(1)]), on_commit=broken, timeout_s=5)
    oplog.wait(oplog.append([rec(2)]), timeout_s=5)  # the writer lives on


def test_a_request_that_timed_out_is_never_answered_by_the_committer(oplog: GatedLog) -> None:
    ran: list[int] = []
    oplog.gate.clear()  # the write hangs (a slow etcd)
    ticket = oplog.append([rec(1)])
    with pytest.raises(LogFailed, match="not durable"):
        oplog.wait(ticket, timeout_s=0.2, on_commit=lambda: ran.append(1))
    oplog.gate.set()
    oplog.wait(oplog.append([rec(2)]))
    assert oplog.committed >= ticket and ran == []  # its thread answered: nobody else may


def test_a_failed_write_answers_nobody_and_fails_every_waiter(oplog: GatedLog) -> None:
    ran: list[int] = []
    oplog.gate.clear()
    oplog.broken = True
    ticket = oplog.append([rec(1)])
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
        oplog.append([rec(2)])


def _fill(sock: socket.socket) -> int:
    """Fill ``sock``'s send path until the peer (not reading) takes no more."""
    sock.setblocking(False)
    n = 0
    try:
        while True:
            n += sock.send(b"x" * 65536)
    except BlockingIOError:
        pass
    sock.setblocking(True)
    return n


def test_try_send_never_blocks_on_a_client_that_stopped_reading(
    socket_pair: tuple[socket.socket, socket.socket],
) -> None:
    """The writer's send on a full socket returns at once; the connection's own thread sends
    the reply once the client reads again, and the client gets it whole and once."""
    a, b = socket_pair
    filled = _fill(a)
    sender = ReplySender(a, rid=7)
    t0 = time.monotonic()
    sender.try_send(P.Reply(code=0, message="m" * 1000))
    assert time.monotonic() - t0 < 1.0 and not sender.sent
    finisher = threading.Thread(target=sender.finish, args=(P.Reply(code=-1),))
    finisher.start()  # blocks until the client drains
    got = 0
    b.settimeout(5)
    while got < filled:
        got += len(b.recv(min(1 << 20, filled - got)))
    finisher.join(5)
    frame = BufferedFrames(b, P.REPLY_CODEC).read()
    assert frame is not None and frame.header.request_id == 7
    assert isinstance(frame.msg, P.Reply) and frame.msg.message == "m" * 1000  # the first


def test_finish_sends_the_whole_reply_when_nobody_tried(
    socket_pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = socket_pair
    ReplySender(a, rid=3).finish(P.Reply(code=0))
    frame = BufferedFrames(b, P.REPLY_CODEC).read()
    assert frame is not None and frame.header.request_id == 3


def test_durable_reply_is_sent_once_over_a_real_socket(
    tmp_path: Path, socket_pair: tuple[socket.socket, socket.socket]
) -> None:
    """``Durable.resolve`` with a real file log: the committing thread sends the reply frame,
    the connection's ``finish`` adds nothing; a log that failed answers RpcFailed instead."""
    a, b = socket_pair
    log = FileOpLog(tmp_path)
    log.load()
    try:
        sender = ReplySender(a, rid=11)
        out = Durable(log, log.append([rec(1)]), P.Reply(message="ok")).resolve(sender)
        assert sender.sent
        sender.finish(out)
        b.settimeout(2)
        frame = BufferedFrames(b, P.REPLY_CODEC).read()
        assert frame is not None and frame.header.request_id == 11
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(1)  # exactly one frame
        log.fail(OSError("disk gone"))
        failed = ReplySender(a, rid=12)
        out = Durable(log, log.appended + 1, P.Reply()).resolve(failed)
        assert isinstance(out, P.Reply) and out.code == -900 and failed.rest is None
    finally:
        log.close()


def test_a_retry_is_not_acknowledged_before_its_first_try_is_durable() -> None:
    """A try that ran out of its master call deadline while its records waited for the log is
    re-sent with the same request id; the deduplication table answers it without changing
    anything, and that answer must wait for the log too (it was sent at once before: a mount
    or a put acknowledged that a failing log never got)."""
    from kvcake.store.config import MasterConfig
    from kvcake.store.errors import RpcFailed
    from kvcake.store.ha.durable import DurableMaster
    from kvcake.store.ha.view import FenceRec
    from kvcake.store.rpc import MasterConnection

    log = GatedLog()
    view = log.load()
    master = DurableMaster(MasterConfig(port=0, http_port=-1, events_port=-1), view, log)
    master.start()
    assert [type(r) for _, recs in log.entries for r in recs] == [FenceRec]  # before serving
    log.entries.clear()
    conn = MasterConnection(master.rpc_address, timeout_s=0.5, retries=1)
    try:
        log.gate.clear()  # the log takes nothing durable now
        with pytest.raises(RpcFailed):  # both tries (the second one: a dedup replay) wait
            conn.call(P.Mount("c1", "h", "seg-1", 1 << 20))
        assert not log.entries
        log.gate.set()
        conn.call(P.Heartbeat("c1", "h"))
        wait_until(lambda: log.entries, timeout=5, every_s=0.01, what="the heartbeat's commit")
        assert [r.name for _, recs in log.entries for r in recs] == ["seg-1"]  # type: ignore[attr-defined]
    finally:
        log.gate.set()
        conn.close()
        master.stop()
