"""Pure logic: SIEVE eviction order and request coalescing."""

from __future__ import annotations

from kvcake.core.ids import SegmentName
from kvcake.transfer.planner import coalesce
from kvcake.transfer.sieve import Sieve
from kvcake.transfer.types import Op, TransferRequest


def test_sieve_evicts_unvisited_oldest_first() -> None:
    s: Sieve[str] = Sieve()
    for k in "abcd":
        s.insert(k)
    s.touch("a")
    s.touch("c")
    assert s.evict() == "b"  # a is visited (bit cleared, survives), b is not
    assert s.evict() == "d"  # c visited -> cleared; d evicted
    assert s.evict() == "a"  # wrap: a's bit was cleared on the first pass
    assert len(s) == 1 and "c" in s


def test_sieve_respects_evictable_and_returns_none() -> None:
    s: Sieve[int] = Sieve()
    for k in range(3):
        s.insert(k)
    assert s.evict(lambda k: k == 2) == 2
    assert s.evict(lambda k: False) is None
    assert len(s) == 2


def test_sieve_remove_keeps_hand_valid() -> None:
    s: Sieve[int] = Sieve()
    for k in range(5):
        s.insert(k)
    assert s.evict() == 0
    s.remove(4)
    s.remove(1)
    assert s.evict() == 2
    assert s.evict() == 3
    assert s.evict() is None


def req(op: Op, lo: int, to: int, n: int, ls: str = "l", ts: str = "t") -> TransferRequest:
    return TransferRequest(op, SegmentName(ls), lo, SegmentName(ts), to, n)


def test_coalesce_merges_contiguous_neighbours_in_any_order() -> None:
    reqs = [req(Op.WRITE, 100, 1100, 50), req(Op.WRITE, 0, 1000, 100), req(Op.WRITE, 150, 1150, 10)]
    runs = coalesce(list(enumerate(reqs)))
    assert len(runs) == 1
    r = runs[0]
    assert (r.local_offset, r.target_offset, r.length) == (0, 1000, 160)
    assert sorted(r.members) == [0, 1, 2]


def test_coalesce_keeps_apart_what_is_not_contiguous() -> None:
    reqs = [
        req(Op.WRITE, 0, 0, 10),
        req(Op.READ, 10, 10, 10),  # other op
        req(Op.WRITE, 10, 20, 10),  # local adjacent, target not
        req(Op.WRITE, 20, 10, 10, ts="u"),  # other target segment
        req(Op.WRITE, 10, 10, 10, ls="m"),  # other local segment
    ]
    runs = coalesce(list(enumerate(reqs)))
    assert len(runs) == 5
    assert sorted(i for r in runs for i in r.members) == [0, 1, 2, 3, 4]
