"""Malformed input to the transfer server and the directory: garbage, oversize and truncated
frames, unknown segments, bad ranges. The server answers or drops that connection only, and
keeps serving everyone else."""

from __future__ import annotations

import contextlib
import socket
import struct

import pytest

from kvcake.core import framing
from kvcake.transfer import DirectoryService, TransferEngine
from kvcake.transfer.metadata import CODEC as DIR_CODEC
from kvcake.transfer.metadata import LIMITS as DIR_LIMITS
from kvcake.transfer.metadata import Reply
from kvcake.transfer.protocol import CODEC, Ack, Fail, Probe, ReadReq, WriteReq
from kvcake.transfer.tcp_transport import probe
from tests.waits import wait_until

from .conftest import EngineFactory, pattern

LIMITS = framing.FrameLimits(max_meta=1 << 20, max_data=1 << 30)


@pytest.fixture
def target(make_engine: EngineFactory) -> tuple[TransferEngine, bytearray]:
    e = make_engine()
    mem = pattern(65536, seed=20)
    e.register_memory("seg", mem)
    return e, mem


def connect(e: TransferEngine) -> socket.socket:
    host, port = e.addresses[0].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), 5)
    s.settimeout(5)
    return s


def reply(s: socket.socket) -> framing.Frame:  # type: ignore[type-arg]
    f = framing.read_frame(s, CODEC, LIMITS)
    assert f is not None
    return f


def closed_by_peer(s: socket.socket) -> bool:
    try:
        while True:
            if s.recv(65536) == b"":
                return True
    except ConnectionResetError:
        return True


def still_serving(e: TransferEngine, mem: bytearray) -> None:
    assert probe(e.addresses[0], 5)
    with connect(e) as s:
        framing.send_frame(s, CODEC, 7, ReadReq("seg", 100, 50))
        f = reply(s)
        assert isinstance(f.msg, Ack) and f.data == bytes(mem[100:150])


def test_garbage_bytes(target) -> None:  # type: ignore[no-untyped-def]
    e, mem = target
    with connect(e) as s:
        s.sendall(b"\x00GARBAGE" * 1000)
        assert closed_by_peer(s)
    still_serving(e, mem)


@pytest.mark.parametrize("meta_len,data_len", [(1 << 20, 0), (10, 1 << 40)])
def test_oversize_frames_refused_before_reading(target, meta_len: int, data_len: int) -> None:  # type: ignore[no-untyped-def]
    e, mem = target
    with connect(e) as s:
        s.sendall(framing.pack_header(1, meta_len, data_len))
        assert closed_by_peer(s)
    still_serving(e, mem)


def test_unknown_segment_and_bad_ranges_keep_the_connection(target) -> None:  # type: ignore[no-untyped-def]
    e, mem = target
    before = bytes(mem)
    with connect(e) as s:
        framing.send_frame(s, CODEC, 1, WriteReq("nope", 0), b"x" * 1000)
        f = reply(s)
        assert isinstance(f.msg, Fail) and f.msg.kind == "UnknownSegment"
        assert f.header.request_id == 1
        framing.send_frame(s, CODEC, 2, WriteReq("seg", 65536 - 10), b"y" * 100)
        want = "range [65526, 65626) exceeds segment 'seg' of 65536 bytes"
        assert reply(s).msg == Fail("OutOfRange", want)
        framing.send_frame(s, CODEC, 3, WriteReq("seg", -5), b"z" * 10)
        assert reply(s).msg.kind == "OutOfRange"  # type: ignore[attr-defined]
        framing.send_frame(s, CODEC, 4, ReadReq("seg", 65000, 1000))
        assert reply(s).msg.kind == "OutOfRange"  # type: ignore[attr-defined]
        framing.send_frame(s, CODEC, 5, ReadReq("seg", 0, 0))
        assert reply(s).msg.kind == "InvalidRequest"  # type: ignore[attr-defined]
        framing.send_frame(s, CODEC, 6, ReadReq("seg", 0, 1 << 40))
        assert reply(s).msg.kind == "OutOfRange"  # type: ignore[attr-defined]
        framing.send_frame(s, CODEC, 7, Ack(5))  # a reply is not a request
        assert reply(s).msg.kind == "InvalidRequest"  # type: ignore[attr-defined]
        meta = b"\xc1\xc1\xc1"  # not msgpack
        s.sendall(framing.pack_header(8, len(meta), 4) + meta + b"data")
        assert reply(s).msg.kind == "MalformedFrame"  # type: ignore[attr-defined]
        framing.send_frame(s, CODEC, 9, Probe())
        assert isinstance(reply(s).msg, Ack)
    assert bytes(mem) == before  # nothing refused was written
    still_serving(e, mem)


@pytest.mark.parametrize("cut", ["header", "meta", "data"])
def test_truncated_frames(target, cut: str) -> None:  # type: ignore[no-untyped-def]
    e, mem = target
    meta = CODEC.encode(WriteReq("seg", 0))
    frame = framing.pack_header(1, len(meta), 4096) + meta + b"q" * 100
    stop = {"header": 10, "meta": framing.HEADER_SIZE + 2, "data": len(frame)}[cut]
    with connect(e) as s:
        s.sendall(frame[:stop])
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_WR)
        assert closed_by_peer(s)  # no Ack for an unfinished write
    still_serving(e, mem)


def test_many_bad_connections_leave_no_threads(target) -> None:  # type: ignore[no-untyped-def]
    e, mem = target
    for i in range(30):
        with connect(e) as s:
            s.sendall(struct.pack("<Q", i) * 5)
    wait_until(lambda: not e.server._conns, timeout=5, every_s=0.01, what="every connection closed")
    assert len(e.server._conns) == 0
    still_serving(e, mem)


def test_directory_survives_malformed_input(directory: DirectoryService) -> None:
    host, port = directory.address.rsplit(":", 1)
    for junk in (b"\xff" * 100, framing.pack_header(1, 1 << 30), framing.pack_header(1, 5)[:10]):
        with socket.create_connection((host, int(port)), 5) as s:
            s.settimeout(5)
            s.sendall(junk)
            with contextlib.suppress(OSError):  # the server may have hung up already
                s.shutdown(socket.SHUT_WR)
            assert closed_by_peer(s)
    with socket.create_connection((host, int(port)), 5) as s:
        s.settimeout(5)
        framing.send_frame(s, DIR_CODEC, 3, Reply(True))  # not a request
        f = framing.read_frame(s, DIR_CODEC, DIR_LIMITS)
        assert f is not None and isinstance(f.msg, Reply)
        assert not f.msg.ok and f.msg.kind == "InvalidRequest"
    from kvcake.transfer import DirectoryClient

    c = DirectoryClient(directory.address)
    assert c.list() == []
    c.close()


def test_a_cut_connection_lands_nothing_it_carries_afterwards(target) -> None:  # type: ignore[no-untyped-def]
    """``cut_inbound`` (a storage node the master forgot, before it mounts again): a write
    whose bytes arrive after the cut -- TCP's retransmission after a partition -- never
    reaches the segment, even on the connection its header came by; new connections serve."""
    e, mem = target
    before = bytes(mem[4096:8192])
    stale = connect(e)
    meta = CODEC.encode(WriteReq("seg", 4096))
    stale.sendall(framing.pack_header(9, len(meta), 4096) + meta + b"\xee" * 1000)
    wait_until(lambda: bytes(mem[4096:5096]) == b"\xee" * 1000)  # the handler is mid-write
    assert e.cut_inbound() >= 1
    with contextlib.suppress(OSError):  # the rest of the frame, after the cut
        stale.sendall(b"\xee" * 3096)
    assert closed_by_peer(stale)
    stale.close()
    assert bytes(mem[5096:8192]) == before[1000:]  # nothing after the cut landed
    with connect(e) as s:  # a new connection writes as before
        framing.send_frame(s, CODEC, 10, WriteReq("seg", 4096), b"\x01\x02\x03\x04")
        assert isinstance(reply(s).msg, Ack)
    assert bytes(mem[4096:4100]) == b"\x01\x02\x03\x04"
    still_serving(e, mem)
