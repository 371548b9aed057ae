import pytest

from kvcake.core.api import (
    KVEvent,
    KVEventKind,
    KVIndex,
    LoadReport,
    Role,
    SamplingParams,
    segment_of,
)
from kvcake.core.ids import BlockHash, InstanceId


def B(*xs: int) -> list[BlockHash]:
    return [BlockHash(x) for x in xs]


P0, P1, P2 = InstanceId("p0"), InstanceId("p1"), InstanceId("p2")


def test_prefix_matches() -> None:
    idx = KVIndex()
    idx.add(P0, B(1, 2, 3))
    idx.add(P1, B(1, 2))
    idx.add(P2, B(2, 3))  # holds later blocks but not the first: no prefix
    assert idx.prefix_matches(B(1, 2, 3, 4)) == {P0: 3, P1: 2}
    assert idx.prefix_matches(B(9)) == {}
    assert idx.prefix_matches([]) == {}
    assert idx.blocks_of(P0) == 3 and len(idx) == 3


def test_events_and_accounting() -> None:
    idx = KVIndex()
    idx.apply(KVEvent(1, P0, KVEventKind.STORED, tuple(B(1, 2))))
    idx.add(P0, B(1))  # duplicate add does not double count
    assert idx.blocks_of(P0) == 2
    idx.apply(KVEvent(2, P0, KVEventKind.REMOVED, tuple(B(2, 7))))
    assert idx.holders(BlockHash(1)) == {P0} and idx.holders(BlockHash(2)) == frozenset()
    idx.add(P1, B(1, 5))
    idx.drop_holder(P0)
    assert idx.blocks_of(P0) == 0 and idx.prefix_matches(B(1, 5)) == {P1: 2}
    # Accounting: per-holder counts always equal the index contents.
    total = sum(len(idx.holders(b)) for b in B(1, 2, 5, 7))
    assert total == idx.blocks_of(P0) + idx.blocks_of(P1)


def test_value_validation() -> None:
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        LoadReport(P0, Role.DECODE, 0.0, kv_blocks_used=5, kv_blocks_total=4)
    assert segment_of(P0) == "kv/p0"
