import random

import pytest

from kvcake.store.allocator import ALIGN, RangeAllocator


def test_allocate_release_coalesces_and_accounts() -> None:
    a = RangeAllocator(1024)
    offs = [a.allocate(100) for _ in range(4)]
    assert offs == [0, 128, 256, 384]
    assert a.allocated + a.free == a.capacity
    a.release(128)
    a.release(384)
    a.check()
    assert a.fragmentation() > 0
    a.release(256)  # merges with both neighbours
    a.release(0)
    a.check()
    assert a.free == 1024 and a.largest_free() == 1024 and a.fragmentation() == 0.0


def test_full_and_errors() -> None:
    a = RangeAllocator(256)
    assert a.allocate(256) == 0
    assert a.allocate(1) is None
    with pytest.raises(ValueError):
        a.release(64)
    with pytest.raises(ValueError):
        a.allocate(0)
    with pytest.raises(ValueError):
        RangeAllocator(0)


def test_random_workload_keeps_invariants() -> None:
    rng = random.Random(7)
    a = RangeAllocator(1 << 20)
    live: list[int] = []
    for _ in range(3000):
        if live and rng.random() < 0.45:
            a.release(live.pop(rng.randrange(len(live))))
        else:
            off = a.allocate(rng.randint(1, 20000))
            if off is not None:
                assert off % ALIGN == 0
                live.append(off)
        assert a.allocated + a.free == a.capacity
    a.check()
    for off in live:
        a.release(off)
    a.check()
    assert a.free == a.capacity
