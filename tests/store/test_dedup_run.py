"""DedupTable.run's inline fast path must keep begin()'s guarantees: one application per seq,
the first outcome replayed, acknowledged seqs refused, both bounds held."""

import pytest

from kvcake.store.dedup import DedupTable, StaleRequest


def test_run_applies_once_replays_and_refuses_stale() -> None:
    t: DedupTable[str] = DedupTable(max_sessions=8, max_pending=4)
    calls: list[int] = []

    def apply(seq: int) -> str:
        calls.append(seq)
        return f"r{seq}"

    assert t.run("c", "s", 1, 0, apply, 1) == "r1"  # new session: slow path
    assert t.run("c", "s", 2, 1, apply, 2) == "r2"  # fast path, acks 1
    assert t.run("c", "s", 2, 1, apply, 2) == "r2"  # a retry: replayed, not applied
    assert calls == [1, 2] and t.replays == 1
    with pytest.raises(StaleRequest):
        t.run("c", "s", 1, 1, apply, 1)  # acknowledged: refused
    with pytest.raises(StaleRequest):
        t.run("c", "s", 3, 3, apply, 3)  # seq <= its own ack
    assert t.stale == 2 and calls == [1, 2]
    assert len(t) == 0  # ack 3 pruned every stored reply


def test_run_bounds_pending_and_sessions() -> None:
    t: DedupTable[int] = DedupTable(max_sessions=2, max_pending=3)
    for seq in range(1, 11):  # never acknowledges: only the newest 3 replies are kept
        assert t.run("c", "s", seq, 0, lambda s=seq: s * 10) == seq * 10
    assert len(t) == 3
    assert t.run("c", "s", 10, 0, lambda: -1) == 100  # still replayed
    assert t.run("c", "s", 1, 0, lambda: -1) == -1  # forgotten (bound): runs again
    for s in ("a", "b"):
        t.run("c", s, 1, 0, lambda: 0)
    assert t.sessions == 2  # least recently used session dropped
