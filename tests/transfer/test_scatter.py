"""Reads that land straight in scattered destinations (transfer/scatter.py, issue 37): the C
receive fills every range exactly and sums each chunk as it lands; a peer that misbehaves
breaks the read with a typed error; a gate closed midway lets no later byte land."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from kvcake.core import framing, integrity, native
from kvcake.core.errors import MalformedFrame, TruncatedFrame
from kvcake.core.ranges import RangeTable
from kvcake.store.readguard import ReadGuard
from kvcake.transfer import scatter
from kvcake.transfer.pool import Endpoint
from kvcake.transfer.protocol import CODEC, AckV, Fail, ReadV

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="kvcake.core.native not built")
CHUNK = 1 << 16  # small chunks: several per value, and pieces that straddle them


def value(seed: int, n: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def split(n: int, parts: int, seed: int) -> list[tuple[int, bytearray]]:
    """A value of n bytes cut at random points into destination buffers (a tiling)."""
    cuts = sorted(np.random.default_rng(seed).choice(np.arange(1, n), parts - 1, replace=False))
    edges = [0, *map(int, cuts), n]
    return [(a, bytearray(b"\xee" * (b - a))) for a, b in itertools.pairwise(edges)]


def seeds(key: str, n: int) -> list[int]:
    return [integrity.chunk_seed(integrity.key_seed(key), i) for i in range(-(-n // CHUNK))]


def expected_sums(key: str, v: bytes) -> list[int]:
    import xxhash

    s = seeds(key, len(v))
    return [
        xxhash.xxh3_64_intdigest(v[i * CHUNK : (i + 1) * CHUNK], seed=x) for i, x in enumerate(s)
    ]


def test_recv_fills_ranges_and_sums_as_read_ahead_then_socket(socket_pair) -> None:  # type: ignore[no-untyped-def]
    from kvcake.core.native.netrecv import recv_sum_many

    a, b = socket_pair
    vals = [value(1, 3 * CHUNK + 17), value(2, 1000), value(3, 2 * CHUNK)]
    tables, dests = [], []
    for i, v in enumerate(vals):
        d = split(len(v), min(7, len(v) // 100), seed=i)
        dests.append(d)
        empty = [(0, memoryview(bytearray(0)))] if i == 1 else []  # a table that is not dense
        tables.append(RangeTable.of_pairs([(o, memoryview(buf)) for o, buf in d] + empty))
    assert [t.dense for t in tables] == [True, False, True]
    stream = b"".join(vals)
    pre = memoryview(bytearray(stream[:5000]))
    sender = threading.Thread(target=lambda: [a.sendall(stream[5000 + i : 5000 + i + 7777]) or
                                              time.sleep(0.001) for i in range(0, len(stream) - 5000, 7777)])  # fmt: skip
    sender.start()
    keys = ["k1", "k2", "k3"]
    got = recv_sum_many(
        b, pre, [(t, seeds(k, t.nbytes)) for t, k in zip(tables, keys, strict=True)], CHUNK, None, 5
    )
    sender.join()
    for v, d in zip(vals, dests, strict=True):
        assert b"".join(bytes(buf) for _, buf in d) == v
    assert got == [expected_sums(k, v) for k, v in zip(keys, vals, strict=True)]


def test_recv_reports_eof_timeout_and_bad_tables(socket_pair) -> None:  # type: ignore[no-untyped-def]
    from kvcake.core.native.netrecv import recv_sum_many

    a, b = socket_pair
    buf = bytearray(4096)
    table = RangeTable.of_pairs([(0, memoryview(buf))])
    a.sendall(b"x" * 100)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        recv_sum_many(b, memoryview(b""), [(table, None)], CHUNK, None, 0.2)
    assert time.monotonic() - t0 < 2
    a.sendall(b"y" * 10)
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(TruncatedFrame):
        recv_sum_many(b, memoryview(b""), [(table, None)], CHUNK, None, 2)
    with pytest.raises(ValueError):  # seeds for the wrong number of chunks
        recv_sum_many(b, memoryview(b""), [(table, [1, 2])], CHUNK, None, 2)


class Peer:
    """A transfer server stand-in on a real socket: reads one ReadV frame, then answers with
    whatever the test scripts (so it can stall, lie and die on cue)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.conn: socket.socket | None = None
        self.rows: list[int] = []
        self.rid = 0
        self.ready = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.conn, _ = self.listener.accept()
        frame = framing.read_frame(self.conn, CODEC, framing.FrameLimits(1 << 20, 0))
        assert frame is not None and isinstance(frame.msg, ReadV)
        self.rid = frame.header.request_id
        self.rows = list(np.frombuffer(frame.msg.desc, "<i8"))
        self.ready.set()

    def reply(self, msg: object, data_len: int) -> None:
        meta = CODEC.encode(msg)
        assert self.conn is not None
        self.conn.sendall(framing.pack_header(self.rid, len(meta), data_len) + meta)

    def close(self) -> None:
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()


@pytest.fixture
def peer() -> Iterator[tuple[Peer, Endpoint]]:
    p = Peer()
    sock = socket.create_connection(p.listener.getsockname())
    ep = Endpoint("peer", sock)
    yield p, ep
    ep.close()
    p.close()


def one_read(
    n: int, parts: int, key: str | None, at: int = 1 << 20
) -> tuple[scatter.ScatterRead, list[tuple[int, bytearray]]]:
    """A value of ``n`` bytes at ``at`` in the peer's segment, into ``parts`` buffers."""
    d = split(n, parts, seed=n)
    table = RangeTable.of_pairs([(o, memoryview(buf)) for o, buf in d])
    return scatter.ScatterRead(at, table, seeds(key, n) if key else None), d


def start(ep: Endpoint, reads: list[scatter.ScatterRead], gate: ReadGuard | None = None):  # type: ignore[no-untyped-def]
    box: dict[str, object] = {}

    def go() -> None:
        try:
            box["out"] = scatter.run(ep, "seg", reads, [list(range(len(reads)))], gate, CHUNK, 5)
        except Exception as exc:  # handed to the test
            box["exc"] = exc

    t = threading.Thread(target=go)
    t.start()
    return t, box


def test_a_read_asks_each_value_whole_and_lands_each_byte_in_place(peer) -> None:  # type: ignore[no-untyped-def]
    """Two values in one frame: one entry each (its span), and the data section, sent in
    pieces that straddle ranges and values, is cut into each value's ranges."""
    p, ep = peer
    v1, v2 = value(7, 2 * CHUNK + 99), value(8, CHUNK // 3)
    r1, d1 = one_read(len(v1), 9, "k1", at=1 << 20)
    r2, d2 = one_read(len(v2), 4, "k2", at=5 << 20)
    t, box = start(ep, [r1, r2])
    assert p.ready.wait(5)
    assert p.rows == [0, 1 << 20, len(v1), 0, 5 << 20, len(v2)]
    p.reply(AckV(), len(v1) + len(v2))
    assert p.conn is not None
    data = v1 + v2
    for i in range(0, len(data), 40_000):
        p.conn.sendall(data[i : i + 40_000])
    t.join(10)
    assert box.get("out") == {0: expected_sums("k1", v1), 1: expected_sums("k2", v2)}, box
    assert b"".join(bytes(b) for _, b in d1) == v1
    assert b"".join(bytes(b) for _, b in d2) == v2


@pytest.mark.parametrize("how", ["short", "refused", "eof"])
def test_a_misbehaving_peer_is_a_typed_error(peer, how: str) -> None:  # type: ignore[no-untyped-def]
    p, ep = peer
    read, _ = one_read(5000, 3, None)
    t, box = start(ep, [read])
    assert p.ready.wait(5)
    if how == "short":
        p.reply(AckV(), 4000)  # a data section of the wrong length
    elif how == "refused":
        p.reply(Fail("OutOfRange", "no"), 0)
    else:
        p.reply(AckV(), 5000)
        assert p.conn is not None
        p.conn.sendall(b"z" * 100)
        p.conn.close()
    t.join(10)
    if how == "short":
        assert isinstance(box.get("exc"), MalformedFrame), box
    elif how == "refused":
        out = box.get("out")
        assert isinstance(out, dict) and type(out[0]).__name__ == "OutOfRange", box
    else:
        assert isinstance(box.get("exc"), TruncatedFrame), box


def test_no_byte_lands_after_the_gate_closed(peer) -> None:  # type: ignore[no-untyped-def]
    """The peer sends half, the caller gives up, then the peer sends the rest: the read ends
    Cancelled and the destinations past the first half still hold what they held."""
    p, ep = peer
    n = 4 * CHUNK
    read, dest = one_read(n, 12, "key")
    guard = ReadGuard()
    t, box = start(ep, [read], guard)
    assert p.ready.wait(5)
    v = value(9, n)
    p.reply(AckV(), n)
    assert p.conn is not None
    p.conn.sendall(v[: n // 2])
    time.sleep(0.2)  # the first half has landed
    t0 = time.monotonic()
    guard.cancel()
    assert time.monotonic() - t0 < 1  # the receive noticed the stop flag within its poll slice
    p.conn.sendall(v[n // 2 :])
    t.join(10)
    assert isinstance(box.get("exc"), scatter.Cancelled), box
    landed = b"".join(bytes(b) for _, b in dest)
    assert landed[: n // 2] == v[: n // 2]
    assert landed[n // 2 :] == b"\xee" * (n - n // 2)


def _sized(*sizes: int) -> list[scatter.ScatterRead]:
    return [scatter.ScatterRead(0, SimpleNamespace(nbytes=b), None) for b in sizes]  # type: ignore[arg-type]


def test_plan_balances_lanes_by_value_then_cuts_frames() -> None:
    # 56 values of 1.5 MB in frames of at most 16 MB over two lanes: 28 values each (whole
    # frames would have given one lane 33 values and the other 23)
    runs = scatter.plan(_sized(*[1_500_000] * 56), 16_000_000, 2)
    assert runs is not None and [sum(map(len, r)) for r in runs] == [28, 28]
    assert [len(f) for f in runs[0]] == [10, 10, 8]
    assert [i for r in runs for f in r for i in f] == list(range(56))  # order kept
    assert scatter.plan(_sized(10, 10, 20, 5, 5, 20), 25, 2) == [[[0, 1], [2]], [[3, 4], [5]]]
    assert scatter.plan(_sized(10, 10, 20), 100, 1) == [[[0, 1, 2]]]
    assert scatter.plan(_sized(7), 100, 4) == [[[0]]]
    assert scatter.plan(_sized(7, 101), 100, 2) is None  # a value larger than a frame
    many = scatter.plan(_sized(*[1] * (scatter.MAX_ENTRIES + 1)), 1 << 30, 1)
    assert many is not None and [len(f) for f in many[0]] == [scatter.MAX_ENTRIES, 1]


def test_a_cancel_waits_for_every_running_commit() -> None:
    """Two lanes land bytes under one guard at once; cancel returns only after both ended,
    and no commit starts after it."""
    guard = ReadGuard()
    inside = threading.Barrier(3)
    release = threading.Event()
    ended: list[float] = []

    def lane() -> None:
        with guard.commit():
            inside.wait()
            release.wait(5)
            ended.append(time.monotonic())

    threads = [threading.Thread(target=lane) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(5)  # both commits are running
    threading.Timer(0.2, release.set).start()
    guard.cancel()
    done = time.monotonic()
    assert len(ended) == 2 and max(ended) <= done
    assert guard.stop is not None and guard.stop.value.value == 1
    with pytest.raises(Exception, match="cancelled"), guard.commit():
        pass
    for t in threads:
        t.join(5)
