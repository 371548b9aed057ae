"""Bounded resources and dead owners: the LRU of peers' mappings, the batch table (timed-out
and uncollected batches are swept, a full table refuses), and same-host readers that stop
using a dead owner's shared memory at once."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from kvcake.core.ids import SegmentName
from kvcake.transfer import (
    DirectoryClient,
    DirectoryService,
    Op,
    OwnerGone,
    PathInfo,
    SegmentInfo,
    TooManyBatches,
    TransferConfig,
    TransferRequest,
    TransferTimeout,
    UnknownBatch,
    cleanup_stale,
)
from kvcake.transfer.shm_transport import Liveness, ShmTransport
from tests.waits import wait_until

from .conftest import EngineFactory, ServerProc, pattern

S = SegmentName


def test_peer_mappings_are_an_lru(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="shm", config=TransferConfig(max_peer_maps=2, io_timeout_s=5.0))
    b = make_engine()
    a.register_memory("a", bytearray(4096))
    mems = {f"p{i}": b.allocate_segment(f"p{i}", 4096) for i in range(3)}
    for i, mem in enumerate(mems.values()):
        mem[:4] = bytes([i]) * 4
    shm = a.transports["shm"]
    assert isinstance(shm, ShmTransport)
    out = bytearray(4)
    for name in ("p0", "p1", "p2", "p0"):
        a.read_into(name, 0, out)
        assert out == bytes([int(name[1])]) * 4
        assert len(shm.mapped()) <= 2
    paths = {n: a.segment_info(n).shm_path for n in mems}
    assert shm.mapped() == [paths["p2"], paths["p0"]]  # p1 evicted, p0 most recent


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A 'transfer server' that accepts connections and never answers."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    yield f"127.0.0.1:{ls.getsockname()[1]}"
    ls.close()


def _publish_hole(directory: DirectoryService, addr: str) -> None:
    c = DirectoryClient(directory.address)
    c.publish(
        SegmentInfo(S("hole"), "elsewhere/1/x", "elsewhere", "other", 1 << 20, (PathInfo(addr),))
    )
    c.close()


def test_batch_table_is_bounded_and_swept(
    make_engine: EngineFactory, directory: DirectoryService, black_hole: str
) -> None:
    _publish_hole(directory, black_hole)
    cfg = TransferConfig(
        max_batches=3, batch_ttl_s=0.2, io_timeout_s=0.4, max_attempts=1, probe_interval_s=60
    )
    a = make_engine(protocol="tcp", config=cfg)
    a.register_memory("a", bytearray(4096))
    req = [TransferRequest(Op.READ, S("a"), 0, S("hole"), 0, 4096)]
    ids = [a.submit(req) for _ in range(3)]
    with pytest.raises(TooManyBatches):
        a.submit(req)  # three running batches fill the table
    with pytest.raises(TransferTimeout):
        a.wait(ids[0], timeout=0.01)  # still running: stays collectable for now
    # the silent peer timed out: they failed
    wait_until(lambda: all(a.status(b).done for b in ids), what="every batch done")
    time.sleep(0.3)  # past batch_ttl_s: nobody collected them
    fresh = a.submit(req)  # sweeps the expired ones
    for b in ids:
        with pytest.raises(UnknownBatch):
            a.status(b)
    assert list(a._batches) == [fresh]
    assert not a.wait(fresh, 10).ok


def test_full_table_drops_the_oldest_finished_batch(make_engine: EngineFactory) -> None:
    a = make_engine(config=TransferConfig(max_batches=2, batch_ttl_s=3600))
    b = make_engine()
    a.register_memory("a", bytearray(4096))
    b.register_memory("b", bytearray(4096))
    req = [TransferRequest(Op.WRITE, S("a"), 0, S("b"), 0, 16)]
    first = a.submit(req)
    wait_until(lambda: a.status(first).done, timeout=5, every_s=0.01, what="the first batch done")
    second = a.submit(req)  # finishes after first
    wait_until(lambda: a.status(second).done, timeout=5, every_s=0.01, what="the second done")
    third = a.submit(req)
    assert len(a._batches) <= 2 and third in a._batches
    with pytest.raises(UnknownBatch):
        a.wait(first)
    assert a.wait(third, 5).ok
    assert a.transfer(req).ok and len(a._batches) <= 2  # inline batches never enter it


def test_liveness_of_a_process() -> None:
    assert Liveness(os.getpid()).alive()
    assert Liveness(None).alive()
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    live = Liveness(p.pid)
    assert live.alive()
    p.kill()
    p.wait()
    assert not live.alive()
    live.close()
    assert not Liveness(p.pid).alive()  # reaped: no such process


def test_reads_stop_at_once_when_the_owner_dies(
    make_engine: EngineFactory, directory: DirectoryService, server_proc: Callable[..., ServerProc]
) -> None:
    srv = server_proc("--directory", directory.address, "--segment", "pool:1MiB")
    a = make_engine()  # auto: a same-host shm segment is mapped
    a.register_memory("a", bytearray(8192))
    data = pattern(4096, seed=9)
    a.write("pool", 100, data)
    out = bytearray(4096)
    a.read_into("pool", 100, out)
    assert out == data
    shm = a.transports["shm"]
    assert isinstance(shm, ShmTransport) and len(shm.mapped()) == 1
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait()
    # The directory still lists the segment (nobody dropped the dead owner yet), the file is
    # still in /dev/shm: yet the very next read fails, typed, and the mapping is gone.
    assert a.segment_info("pool").shm_path is not None
    with pytest.raises(OwnerGone):  # the very next read: not one more byte from a dead owner
        a.read_into("pool", 100, out)
    with pytest.raises(OwnerGone):  # a fresh lookup maps nothing for a dead owner
        a.transfer_sync_read("pool", "a", 0, 0, 4096)
    res = a.transfer([TransferRequest(Op.READ, S("a"), 0, S("pool"), 0, 16)])
    assert res.results[0].error_type == "OwnerGone"
    assert shm.mapped() == []
    cleanup_stale()


def test_concurrent_first_reads_share_one_mapping(make_engine: EngineFactory) -> None:
    """Threads mapping a peer's segment for the first time at once: none may close the mapping
    another is copying through (was: 'operation forbidden on released memoryview object')."""
    import threading

    a = make_engine(protocol="shm", config=TransferConfig(io_timeout_s=5.0))
    b = make_engine()
    mem = b.allocate_segment("p", 4096)
    mem[:4] = b"kvkv"
    shm = a.transports["shm"]
    assert isinstance(shm, ShmTransport)
    target = a.segment_info("p")
    errors: list[BaseException] = []
    for _ in range(20):
        shm.forget(target.shm_path or "")
        gate = threading.Barrier(8)

        def read(gate: threading.Barrier = gate) -> None:
            out = memoryview(bytearray(4))
            gate.wait()
            try:
                shm._copy(Op.READ, out, target, 0)
                assert bytes(out) == b"kvkv"
            except BaseException as exc:  # collected for the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(shm.mapped()) == 1
    assert errors == []


def test_connections_past_the_bound_are_closed_and_the_server_keeps_serving(
    make_engine: EngineFactory,
) -> None:
    """One thread per connection, so the server bounds them: the connection past
    ``max_conn_threads`` is closed at once, and a slot freed by a closed peer is reused."""
    server_engine = make_engine()
    server_engine.register_memory("m", bytearray(b"x" * 64))
    server = server_engine.server
    server.max_conn_threads = 2
    host, port = server.addresses[0].rsplit(":", 1)
    held = [socket.create_connection((host, int(port))) for _ in range(2)]
    wait_until(lambda: len(server._conns) >= 2, timeout=5, every_s=0.01, what="2 connections held")
    extra = socket.create_connection((host, int(port)))
    extra.settimeout(5)
    assert extra.recv(1) == b""  # closed by the server, not left hanging
    assert server.conns_refused == 1
    extra.close()
    held.pop().close()
    wait_until(lambda: len(server._conns) <= 1, timeout=5, every_s=0.01, what="a slot freed")
    reader = make_engine()
    out = bytearray(64)
    reader.read_into("m", 0, out)  # a fresh peer gets the freed slot
    assert out == b"x" * 64
    for s in held:
        s.close()
