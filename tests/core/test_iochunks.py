"""Bulk socket calls are cut into groups of at most IO_CALL_BYTES (kvcake.core.iochunks)."""

from __future__ import annotations

import random
import socket
import threading

import numpy as np
import pytest

from kvcake.core import framing
from kvcake.core.iochunks import IO_CALL_BYTES, io_groups
from kvcake.transfer.stream import recv_exact_views, send_all


def _joined(groups: list[list[memoryview]]) -> bytes:
    return b"".join(bytes(v) for g in groups for v in g)


@pytest.mark.parametrize("seed", range(5))
def test_groups_keep_every_byte_in_order_within_both_caps(seed: int) -> None:
    rng = random.Random(seed)
    parts = [rng.randbytes(rng.choice([0, 1, 7, 100, 4096, 70_000])) for _ in range(40)]
    cap, max_parts = rng.choice([1, 10, 4096, 65_536]), rng.choice([1, 3, 16])
    groups = list(io_groups(parts, cap, max_parts))
    assert _joined(groups) == b"".join(parts)
    for g in groups:
        assert g, "no empty group"
        assert sum(v.nbytes for v in g) <= cap
        assert len(g) <= max_parts
        assert all(v.nbytes for v in g), "empty parts are dropped"
    # Every group but the last is full in bytes or in parts: no needless extra calls.
    for g in groups[:-1]:
        assert sum(v.nbytes for v in g) == cap or len(g) == max_parts


def test_a_part_larger_than_the_cap_is_split_into_views_of_the_same_memory() -> None:
    buf = bytearray(b"x" * 10)
    groups = list(io_groups([memoryview(buf)], cap=4))
    assert [[v.nbytes for v in g] for g in groups] == [[4], [4], [2]]
    groups[1][0][0] = ord("y")  # a view, not a copy
    assert buf[4] == ord("y")


def test_views_of_wider_items_are_cut_in_bytes() -> None:
    arr = np.arange(6, dtype=np.float32)  # 24 bytes, itemsize 4
    groups = list(io_groups([memoryview(arr)], cap=10))
    assert [sum(v.nbytes for v in g) for g in groups] == [10, 10, 4]
    assert _joined(groups) == arr.tobytes()


def test_bad_caps_are_refused() -> None:
    with pytest.raises(ValueError):
        list(io_groups([b"x"], cap=0))
    with pytest.raises(ValueError):
        list(io_groups([b"x"], max_parts=0))


def test_large_vectored_send_and_receive_over_a_real_socket_arrive_intact() -> None:
    """3.5 MiB in 41 odd-sized views: several groups per side, views straddling group
    boundaries, the receiver's views laid out differently from the sender's."""
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(1, 200_000, 41)]
    data = rng.integers(0, 256, sum(sizes), dtype=np.uint8).tobytes()
    assert len(data) > 4 * IO_CALL_BYTES
    src = memoryview(data)
    parts, at = [], 0
    for s in sizes:
        parts.append(src[at : at + s])
        at += s
    out = bytearray(len(data))
    out_views, at = [], 0
    for s in reversed(sizes):  # another cut of the same bytes
        out_views.append(memoryview(out)[at : at + s])
        at += s
    a, b = socket.socketpair()
    try:
        t = threading.Thread(target=send_all, args=(a, parts))
        t.start()
        recv_exact_views(b, out_views)
        t.join(10)
        assert bytes(out) == data
        t = threading.Thread(target=framing.sendall_parts, args=(a, [data]))
        t.start()
        again = bytearray(len(data))
        framing.recv_exact_into(b, memoryview(again))
        t.join(10)
        assert bytes(again) == data
    finally:
        a.close()
        b.close()


def test_a_peer_closing_midway_is_a_truncated_frame() -> None:
    a, b = socket.socketpair()
    try:
        a.sendall(b"x" * 1000)
        a.close()
        with pytest.raises(framing.TruncatedFrame):
            recv_exact_views(b, [memoryview(bytearray(IO_CALL_BYTES)) for _ in range(3)])
    finally:
        b.close()
