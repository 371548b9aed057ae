"""Write fences (transfer/fences.py): a write carrying an older allocation's fence into bytes
the owner was told belong to a newer allocation is refused on every TCP write path (single,
sliced, vectored, a registered-segment batch) and lands nothing; current and unfenced writes
land; malformed fences are refused without closing the connection."""

from __future__ import annotations

import socket
import struct

import pytest

from kvcake.core import framing
from kvcake.core.errors import TransferError
from kvcake.transfer import TransferEngine, TransferRequest
from kvcake.transfer.errors import StaleWrite
from kvcake.transfer.fences import FenceBook
from kvcake.transfer.protocol import CODEC, Ack, AckV, Fail, WriteV
from kvcake.transfer.types import Op

from .conftest import EngineFactory

LIMITS = framing.FrameLimits(max_meta=1 << 20, max_data=1 << 30)
SIZE = 4 << 20


# --- the book (pure logic) --------------------------------------------------------------------


def test_an_older_fence_is_refused_only_over_a_newer_range() -> None:
    book = FenceBook()
    book.note([("s", 1000, 500, 7)])
    book.check("s", 1000, 500, 7)  # its own allocation
    book.check("s", 1000, 500, 9)  # newer than anything noted
    book.check("s", 0, 1000, 3)  # ends where the noted range starts
    book.check("s", 1500, 100, 3)  # starts where it ends
    book.check("other", 1000, 500, 3)  # another segment
    book.check("s", 1000, 500, 0)  # not fenced
    for lo, n in ((1000, 500), (999, 2), (1499, 10), (0, 5000)):
        with pytest.raises(StaleWrite, match="newer allocation"):
            book.check("s", lo, n, 6)
    assert book.refused == 4


def test_a_newer_note_replaces_the_ranges_it_overlaps_and_a_late_older_one_does_not() -> None:
    book = FenceBook()
    book.note([("s", 0, 100, 5), ("s", 100, 100, 6)])
    book.note([("s", 50, 100, 8)])  # over both: they were freed
    assert book.ranges("s") == 1
    book.check("s", 0, 50, 1)  # the old ranges' bytes outside the new one: no claim
    with pytest.raises(StaleWrite):
        book.check("s", 60, 10, 6)
    book.note([("s", 50, 100, 6)])  # a late repeat of an older note
    with pytest.raises(StaleWrite):
        book.check("s", 60, 10, 6)
    assert book.newest == 8


def test_the_book_is_bounded_and_forgets_the_oldest_half() -> None:
    book = FenceBook(max_ranges=8)
    book.note([("s", i * 10, 10, i + 1) for i in range(9)])
    assert book.ranges("s") <= 8
    with pytest.raises(StaleWrite):
        book.check("s", 80, 10, 1)  # the newest range is kept
    book.check("s", 0, 10, 0)
    book.forget("s")
    assert book.ranges("s") == 0


def test_a_write_below_its_segments_floor_is_refused_wherever_it_goes() -> None:
    book = FenceBook()
    book.floor([("s", 100)])
    book.floor([("s", 50)])  # never lowered
    book.check("s", 0, 10, 100)
    book.check("t", 0, 10, 99)  # another segment
    with pytest.raises(StaleWrite, match="floor 100"):
        book.check("s", 123456, 10, 99)
    assert book.newest == 100
    book.forget("s")
    book.check("s", 0, 10, 99)


# --- on the wire ------------------------------------------------------------------------------


@pytest.fixture
def pair(make_engine: EngineFactory) -> tuple[TransferEngine, TransferEngine, bytearray]:
    owner = make_engine()
    mem = bytearray(SIZE)
    owner.register_memory("seg", mem)
    writer = make_engine(protocol="tcp")  # same host: force the server path
    return owner, writer, mem


def test_every_tcp_write_path_refuses_a_stale_fence_and_lands_nothing(
    pair: tuple[TransferEngine, TransferEngine, bytearray],
) -> None:
    owner, writer, mem = pair
    owner.server.fences.note([("seg", 0, SIZE, 10)])
    small, big = b"\x01" * 4096, b"\x02" * (3 << 20)  # one request; several slices
    for data in (small, big):  # (a sliced write's refusal comes as its batch's error)
        with pytest.raises(TransferError, match="newer allocation"):
            writer.write("seg", 0, data, fence=9)
    result = writer.write_many([("seg", 0, small, None), ("seg", 8192, small, None)], fence=9)
    assert [r.error_type for r in result.results] == ["StaleWrite"] * 2
    src = bytearray(b"\x03" * 8192)
    writer.register_memory("local", src)
    reqs = [TransferRequest(Op.WRITE, "local", 0, "seg", 0, 4096, fence=9)]
    reqs.append(TransferRequest(Op.WRITE, "local", 4096, "seg", 16384, 4096, fence=9))
    assert not writer.transfer(reqs).ok  # the one-frame (vectored) plan
    assert not writer.transfer(reqs[:1]).ok  # the general planner
    assert mem == bytearray(SIZE)  # nothing landed
    writer.write("seg", 0, small, fence=10)  # the current allocation
    writer.write("seg", 4096, big, fence=11)  # newer than anything noted
    writer.write("seg", 8192, small)  # not fenced
    assert writer.transfer([TransferRequest(Op.WRITE, "local", 0, "seg", 0, 8192, fence=10)]).ok
    assert mem[:8192] == src and mem[8192 + 4096 : 8192 + 8192] == big[4096:8192]
    assert owner.server.fences.refused >= 6


def test_malformed_fences_are_refused_and_the_connection_stays_usable(
    pair: tuple[TransferEngine, TransferEngine, bytearray],
) -> None:
    owner, _, mem = pair
    host, port = owner.addresses[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), 5) as s:
        s.settimeout(5)
        desc = struct.pack("<3q", 0, 0, 4)
        for bad in (b"\x01\x02\x03", struct.pack("<2q", 1, 1)):  # torn; two for one entry
            framing.send_frame(s, CODEC, 1, WriteV(["seg"], desc, bad), b"abcd")
            f = framing.read_frame(s, CODEC, LIMITS)
            assert f is not None and isinstance(f.msg, Fail) and f.msg.kind == "InvalidRequest"
        framing.send_frame(s, CODEC, 2, WriteV(["seg"], desc, struct.pack("<q", 5)), b"abcd")
        f = framing.read_frame(s, CODEC, LIMITS)
        assert f is not None and isinstance(f.msg, AckV) and not f.msg.failed
        assert isinstance(f.msg, (Ack, AckV))
    assert mem[:4] == b"abcd"
