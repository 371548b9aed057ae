"""Buffered frame I/O on a real socket pair, and the endpoint pool's accounting."""

from __future__ import annotations

import socket
import threading

import pytest

from kvcake.core import framing
from kvcake.core.errors import TruncatedFrame
from kvcake.transfer.pool import EndpointPool
from kvcake.transfer.stream import AdaptivePoll, FrameReader, FrameWriter, recv_adaptive

from .conftest import EngineFactory


def test_reader_mixes_readahead_and_direct_receive() -> None:
    a, b = socket.socketpair()
    with a, b:
        payload = bytes(range(256)) * 64  # 16 KiB
        frames = b"".join(
            framing.pack_header(i, 3, len(payload)) + b"abc" + payload for i in range(3)
        )
        t = threading.Thread(target=a.sendall, args=(frames,))
        t.start()
        r = FrameReader(b, readahead=100)
        for i in range(3):
            hdr = r.read_header(framing.DEFAULT_LIMITS)
            assert hdr is not None and hdr.request_id == i
            assert r.read_bytes(hdr.meta_len) == b"abc"
            if i == 1:
                r.skip(hdr.data_len)
                continue
            out = bytearray(hdr.data_len)
            r.read_into(memoryview(out))
            assert bytes(out) == payload
        t.join()
        a.shutdown(socket.SHUT_WR)
        assert r.read_header(framing.DEFAULT_LIMITS) is None  # clean EOF


@pytest.mark.parametrize("delay_s", [0.0, 0.02])
def test_busy_polling_reader_gets_early_and_late_bytes(delay_s: float) -> None:
    """Bytes inside the polling window and bytes after it (the blocking recv) both arrive;
    EOF still reads as EOF."""
    a, b = socket.socketpair()
    with a, b:
        frame = framing.pack_header(7, 3, 0) + b"abc"
        timer = threading.Timer(delay_s, a.sendall, args=(frame,))
        timer.start()
        r = FrameReader(b, busy_poll_us=200)
        hdr = r.read_header(framing.DEFAULT_LIMITS)
        assert hdr is not None and hdr.request_id == 7 and r.read_bytes(3) == b"abc"
        timer.join()
        a.shutdown(socket.SHUT_WR)
        assert r.read_header(framing.DEFAULT_LIMITS) is None


def test_busy_poll_setting_is_validated() -> None:
    from kvcake.core.errors import ConfigError
    from kvcake.transfer import TransferConfig

    with pytest.raises(ConfigError, match="busy_poll_us"):
        TransferConfig(busy_poll_us=-1)


def test_reader_truncated_header() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(framing.pack_header(1, 0)[:7])
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(TruncatedFrame):
            FrameReader(b).read_header(framing.DEFAULT_LIMITS)


def test_writer_batches_and_keeps_order() -> None:
    a, b = socket.socketpair()
    with a, b:
        w = FrameWriter(a, flush_bytes=1 << 20)
        data = memoryview(bytearray(b"x" * 1000))
        for i in range(10):
            w.queue(f"h{i}".encode(), data if i % 2 else None)
        w.flush()
        a.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := b.recv(65536):
            got += chunk
        want = b"".join(f"h{i}".encode() + (b"x" * 1000 if i % 2 else b"") for i in range(10))
        assert got == want


def test_pool_accounting_and_connect_failure(make_engine: EngineFactory) -> None:
    target = make_engine()
    pool = EndpointPool(cap=2, connect_timeout_s=1.0, io_timeout_s=0.5)
    addr = target.addresses[0]
    e1 = pool.acquire(addr)
    e2 = pool.acquire(addr)
    pool.check()
    assert pool.stats()["busy"] == 2
    with pytest.raises(Exception, match="no free endpoint"):
        pool.acquire(addr)  # cap reached, nothing idle: waits io_timeout, then gives up
    pool.release(e1)
    e3 = pool.acquire(addr)
    assert e3 is e1  # idle endpoint reused
    pool.release(e2, healthy=False)  # closed, slot freed
    pool.release(e3)
    pool.check()
    assert pool.stats() | {} == {
        "open": 1,
        "idle": 1,
        "busy": 0,
        "cap": 2,
        "created": 2,
        "evicted": 0,
    }
    with pytest.raises(Exception, match="cannot connect"):
        pool.acquire("127.0.0.1:1")  # nothing listens on port 1
    pool.check()
    pool.close()


def test_adaptive_poll_follows_the_client_gaps() -> None:
    p = AdaptivePoll(50)  # base 50 µs, cap 500 µs
    assert p.spin_ns == 50_000
    for _ in range(4):
        p.observe(100_000, 1, preempted=False)
    assert p.spin_ns == 170_000  # 1.5 x 100 µs + 20 µs
    p.observe(400_000, 2, preempted=False)
    assert p.spin_ns == 500_000  # capped
    p.observe(5_000_000, 3, preempted=False)  # an idle gap: back to the base window
    assert p.spin_ns == 50_000
    for _ in range(4):
        p.observe(10_000, 4, preempted=False)
    assert p.spin_ns == 50_000  # never below the base
    p.observe(100_000, 5, preempted=True)  # a busy machine: base only for a while
    assert p.spin_ns == 50_000
    assert AdaptivePoll(0).spin_ns == 0


def test_recv_adaptive_learns_from_the_wait() -> None:
    a, b = socket.socketpair()
    with a, b:
        p = AdaptivePoll(50)
        b.sendall(b"x")
        assert recv_adaptive(a.recv, (10,), p) == b"x"
        threading.Timer(0.01, lambda: b.sendall(b"y")).start()
        assert recv_adaptive(a.recv, (10,), p) == b"y"  # slept in recv
        assert p.spin_ns == 50_000  # a 10 ms gap is an idle client


def test_a_broken_endpoint_is_reset_so_the_rest_of_its_write_never_arrives() -> None:
    """A write that timed out against a peer that reads nothing (a paused storage node) is
    released unhealthy: the connection is reset, so what the kernel still held to send never
    reaches the peer when it wakes (its put is revoked by then). With a graceful close the
    peer received all ~8 MiB the kernel had accepted."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # inherited by the accepted
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    pool = EndpointPool(4, connect_timeout_s=2.0, io_timeout_s=0.3)
    ep = pool.acquire(f"127.0.0.1:{srv.getsockname()[1]}")
    peer, _ = srv.accept()
    with srv, peer:
        ep.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        with pytest.raises(OSError):  # the kernel-side send timeout (io_timeout_s)
            ep.sock.sendall(b"x" * (32 << 20))
        pool.release(ep, healthy=False)  # what the transport does with a failed endpoint
        got, reset = 0, False
        peer.settimeout(2.0)
        try:
            while data := peer.recv(1 << 20):
                got += len(data)
        except ConnectionResetError:
            reset = True
    pool.close()
    assert reset and got < 2 << 20, (got, reset)
