"""BatchTable: bounded, swept, oldest finished dropped first (pure logic, a fake clock)."""

from __future__ import annotations

import pytest

from kvcake.core.ids import BatchId
from kvcake.transfer.batch import Batch
from kvcake.transfer.batchtable import SWEEP_EVERY_S, BatchTable
from kvcake.transfer.errors import TooManyBatches, UnknownBatch


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def batch(i: int, done_at: float = 0.0) -> Batch:
    b = Batch(BatchId(i), 1)
    b.done_at = done_at  # 0: still running
    return b


def test_get_and_discard() -> None:
    t = BatchTable(4, 60.0, Clock())
    b = batch(1)
    t.add(b)
    assert t.get(BatchId(1)) is b and BatchId(1) in t and len(t) == 1
    t.discard(BatchId(1))
    t.discard(BatchId(1))  # twice is harmless
    with pytest.raises(UnknownBatch, match="unknown batch 1"):
        t.get(BatchId(1))
    assert list(t) == []


def test_full_of_running_batches_refuses_and_stays_bounded() -> None:
    t = BatchTable(2, 60.0, Clock())
    t.add(batch(1))
    t.add(batch(2))
    with pytest.raises(TooManyBatches, match="wait\\(\\) for some first"):
        t.add(batch(3))
    assert sorted(t) == [1, 2]


def test_full_table_drops_the_oldest_finished_first() -> None:
    clock = Clock()
    t = BatchTable(3, 3600.0, clock)
    t.add(batch(1, done_at=clock.t - 5))
    t.add(batch(2, done_at=clock.t - 9))  # finished earliest
    t.add(batch(3))  # running: never dropped for room
    t.add(batch(4))
    assert sorted(t) == [1, 3, 4]
    t.add(batch(5))
    assert sorted(t) == [3, 4, 5]
    with pytest.raises(TooManyBatches):
        t.add(batch(6))
    assert len(t) == 3


def test_expired_batches_are_swept_at_most_once_a_second() -> None:
    clock = Clock()
    t = BatchTable(10, 2.0, clock)
    t.add(batch(1, done_at=clock.t))
    t.add(batch(2))
    clock.t += 3.0  # batch 1 expired (finished 3 s ago, ttl 2 s); a sweep is due
    t.add(batch(3))
    assert sorted(t) == [2, 3]
    swept = clock.t
    t.get(BatchId(3)).done_at = swept - 10.0  # now expired as well
    clock.t = swept + SWEEP_EVERY_S / 2  # too soon after the last sweep: none
    t.add(batch(4))
    assert 3 in t
    clock.t = swept + SWEEP_EVERY_S * 1.5
    t.add(batch(5))
    assert sorted(t) == [2, 4, 5]


@pytest.mark.parametrize(("n", "ttl"), [(0, 1.0), (1, 0.0), (-1, 5.0)])
def test_bad_bounds_are_refused(n: int, ttl: float) -> None:
    with pytest.raises(ValueError, match="max_batches >= 1"):
        BatchTable(n, ttl)
