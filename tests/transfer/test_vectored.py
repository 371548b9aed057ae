"""Vectored frames (WriteV / ReadV / AckV): one frame per batch of blocks, an iovec per block.
Per-entry refusals fail alone (the other entries land, a refused write's bytes are drained);
a malformed table refuses the frame and keeps the connection; a cut stream closes it."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import numpy as np
import pytest

from kvcake.core import framing
from kvcake.core.ids import SegmentName
from kvcake.transfer import Op, TransferEngine, TransferRequest
from kvcake.transfer.protocol import CODEC, MAX_ENTRIES, AckV, Fail, ReadV, WriteV
from kvcake.transfer.stream import FrameReader, recv_exact_views

from .conftest import EngineFactory, pattern
from .test_malformed import LIMITS, closed_by_peer, connect, reply, still_serving

S = SegmentName


def desc(*rows: tuple[int, int, int]) -> bytes:
    return struct.pack(f"<{3 * len(rows)}q", *(v for r in rows for v in r))


@pytest.fixture
def target(make_engine: EngineFactory) -> tuple[TransferEngine, bytearray]:
    e = make_engine()
    mem = pattern(65536, seed=20)
    e.register_memory("seg", mem)
    return e, mem


def test_write_v_entries_fail_alone(target) -> None:  # type: ignore[no-untyped-def]
    e, mem = target
    rows = [(0, 0, 100), (1, 0, 50), (0, 65500, 100), (0, 200, 10), (7, 0, 5), (0, -1, 3)]
    data = [bytes([i + 1]) * max(n, 0) for i, (_, _, n) in enumerate(rows)]
    meta = CODEC.encode(WriteV(["seg", "nope"], desc(*rows)))
    body = b"".join(data)
    with connect(e) as s:
        s.sendall(framing.pack_header(5, len(meta), len(body)) + meta + body)
        f = reply(s)
        assert f.header.request_id == 5 and isinstance(f.msg, AckV) and not f.data
        kinds = {i: kind for i, kind, _ in f.msg.failed}
        assert kinds == {1: "UnknownSegment", 2: "OutOfRange", 4: "InvalidRequest", 5: "OutOfRange"}
        # The good entries landed, in their places; the refused ones' bytes were drained.
        assert bytes(mem[0:100]) == data[0] and bytes(mem[200:210]) == data[3]
        meta = CODEC.encode(ReadV(["seg"], desc((0, 200, 10), (0, 70000, 5), (0, 0, 100))))
        s.sendall(framing.pack_header(6, len(meta), 0) + meta)
        f = reply(s)
        assert isinstance(f.msg, AckV) and [i for i, _, _ in f.msg.failed] == [1]
        assert f.data == data[3] + data[0]  # only the good entries' bytes, in entry order
    still_serving(e, mem)


@pytest.mark.parametrize(
    "table,data_len",
    [
        (b"\x01" * 25, 0),  # not whole rows
        (b"", 0),  # no entries
        (desc(*[(0, 0, 1)] * (MAX_ENTRIES + 1)), MAX_ENTRIES + 1),  # too many iovecs
        (desc((0, 0, 100)), 60),  # lengths do not add up to the data section
    ],
)
def test_malformed_table_refuses_the_frame_only(target, table: bytes, data_len: int) -> None:  # type: ignore[no-untyped-def]
    e, mem = target
    before = bytes(mem)
    meta = CODEC.encode(WriteV(["seg"], table))
    with connect(e) as s:
        s.sendall(framing.pack_header(1, len(meta), data_len) + meta + b"w" * data_len)
        f = reply(s)
        assert isinstance(f.msg, Fail) and f.msg.kind == "InvalidRequest"
        if data_len != 60:  # (a read has no data section to add up to)
            meta = CODEC.encode(ReadV(["seg"], table))
            s.sendall(framing.pack_header(2, len(meta), 0) + meta)
            f = reply(s)
            assert isinstance(f.msg, Fail) and f.msg.kind == "InvalidRequest"
    assert bytes(mem) == before
    still_serving(e, mem)


def test_truncated_vectored_write_closes_only_that_connection(target) -> None:  # type: ignore[no-untyped-def]
    e, mem = target
    meta = CODEC.encode(WriteV(["seg"], desc((0, 0, 4096), (0, 8192, 4096))))
    with connect(e) as s:
        s.sendall(framing.pack_header(1, len(meta), 8192) + meta + b"q" * 5000)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_WR)
        assert closed_by_peer(s)  # no AckV for an unfinished write
    still_serving(e, mem)


def test_recv_exact_views_across_partial_arrivals() -> None:
    a, b = socket.socketpair()
    payload = pattern(3 * 4096 + 100, seed=3)
    bufs = [bytearray(4096), bytearray(1), bytearray(8191), bytearray(100)]
    views = [memoryview(x) for x in bufs]

    def trickle() -> None:
        for i in range(0, len(payload), 777):  # cuts fall inside views
            a.sendall(payload[i : i + 777])
            time.sleep(0.001)

    t = threading.Thread(target=trickle)
    t.start()
    try:
        recv_exact_views(b, views)
    finally:
        t.join()
    assert b"".join(bufs) == bytes(payload)
    assert [v.nbytes for v in views] == [4096, 1, 8191, 100]  # the caller's list is untouched
    a.close()
    with pytest.raises(framing.TruncatedFrame):
        recv_exact_views(b, [memoryview(bytearray(1))])
    b.close()


def test_reader_views_take_the_read_ahead_first() -> None:
    a, b = socket.socketpair()
    payload = pattern(6000, seed=4)
    meta = CODEC.encode(AckV([]))
    a.sendall(framing.pack_header(1, len(meta), len(payload)) + meta + payload)
    r = FrameReader(b)
    head = r.read_head(LIMITS)
    assert head is not None and head[2] == len(payload)
    assert r.read_msg(CODEC, head[1]) == AckV([])
    assert r.buffered > 0  # part of the data came with the header
    out = [bytearray(10), bytearray(3000), bytearray(2990)]
    r.read_into_views([memoryview(x) for x in out])
    assert b"".join(out) == bytes(payload)
    a.close()
    b.close()


def test_large_scattered_batch_is_split_into_frames(make_engine: EngineFactory) -> None:
    """More blocks than one frame holds, mixed ops in one batch, byte-exact over TCP."""
    a = make_engine(protocol="tcp")
    b = make_engine()
    n = MAX_ENTRIES + 100
    local = np.frombuffer(pattern(2 * n * 1024, seed=5), dtype=np.uint8).copy()
    a.register_memory("a", local)
    target = b.allocate_segment("b", 4 * n * 1024)
    writes = [TransferRequest(Op.WRITE, S("a"), i * 1024, S("b"), i * 3072, 1024) for i in range(n)]
    assert a.transfer(writes).ok
    for i in range(n):
        assert (
            bytes(target[i * 3072 : i * 3072 + 1024]) == local[i * 1024 : (i + 1) * 1024].tobytes()
        )
    half = n * 1024
    mixed = [
        TransferRequest(Op.READ, S("a"), half + i * 1024, S("b"), i * 3072, 1024) for i in range(n)
    ] + [
        TransferRequest(Op.WRITE, S("a"), i * 1024, S("b"), i * 3072 + 2048, 1024) for i in range(n)
    ]
    res = a.wait(a.submit(mixed), 30)
    assert res.ok and len(res.results) == 2 * n
    assert local[half:].tobytes() == local[:half].tobytes()
    for i in range(n):
        got = bytes(target[i * 3072 + 2048 : i * 3072 + 3072])
        assert got == local[i * 1024 : (i + 1) * 1024].tobytes()


def test_remote_refusal_fails_only_its_entries(make_engine: EngineFactory) -> None:
    """A segment the initiator still has cached is gone on the server: its entries of a
    frame fail with UnknownSegment, the other segment's entries of the same frame land."""
    a = make_engine(protocol="tcp")
    b = make_engine()
    local = pattern(8192, seed=6)
    a.register_memory("a", local)
    keep = b.allocate_segment("keep", 8192)
    b.allocate_segment("gone", 8192)
    warm = [TransferRequest(Op.READ, S("a"), 0, S(n), 0, 16) for n in ("keep", "gone")]
    assert a.transfer(warm).ok  # both are now in a's cache
    b.unregister("gone")
    reqs = [
        TransferRequest(Op.WRITE, S("a"), 0, S("keep"), 0, 4096),
        TransferRequest(Op.WRITE, S("a"), 4096, S("gone"), 0, 4096),
        TransferRequest(Op.WRITE, S("a"), 4096, S("keep"), 4096, 4096),
    ]
    res = a.transfer(reqs)
    assert [r.error_type for r in res.results] == [None, "UnknownSegment", None]
    assert bytes(keep[:8192]) == bytes(local)
