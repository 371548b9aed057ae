import math

import pytest

from kvcake.core.costmodel import DecodeCoefficients
from kvcake.sim.batch import DecodeBatch
from kvcake.sim.events import EventQueue, Prio
from kvcake.sim.request import SimRequest, tbt_from_runs


def test_events_pop_by_time_then_priority_then_sequence() -> None:
    eq = EventQueue()
    seen: list[str] = []
    rec = lambda now, tag: seen.append(tag)  # noqa: E731
    eq.schedule(2.0, Prio.ARRIVAL, rec, "t2-arrival")
    eq.schedule(1.0, Prio.ARRIVAL, rec, "t1-arrival-a")
    eq.schedule(1.0, Prio.FINISH, rec, "t1-finish")
    eq.schedule(1.0, Prio.ARRIVAL, rec, "t1-arrival-b")
    eq.schedule(1.0, Prio.BATCH, rec, "t1-batch")
    assert eq.run() == 5
    assert seen == ["t1-finish", "t1-batch", "t1-arrival-a", "t1-arrival-b", "t2-arrival"]
    assert eq.now == 2.0 and eq.processed == 5


def test_events_cannot_go_back_in_time_and_run_until() -> None:
    eq = EventQueue()
    eq.schedule(5.0, Prio.ARRIVAL, lambda n, p: None)
    eq.schedule(1.0, Prio.ARRIVAL, lambda n, p: eq.schedule(0.5, Prio.ARRIVAL, lambda *_: None))
    with pytest.raises(ValueError):
        eq.run()
    eq2 = EventQueue()
    eq2.schedule(5.0, Prio.ARRIVAL, lambda n, p: None)
    assert eq2.run(until=4.0) == 0 and len(eq2) == 1


def test_tbt_is_mean_of_longest_ten_percent() -> None:
    # 20 gaps: 18 of 0.1 s and two stalls of 1.0 and 2.0 s -> top 2 mean 1.5
    runs = [(1, 2.0, 0.0), (9, 0.1, 0.0), (1, 1.0, 0.0), (9, 0.1, 0.0)]
    assert tbt_from_runs(runs) == pytest.approx(1.5)
    # a single increasing run: closed form == brute force
    n, g0, inc = 37, 0.02, 0.001
    gaps = sorted(g0 + inc * k for k in range(n))
    k = math.ceil(0.1 * n)
    assert tbt_from_runs([(n, g0, inc)]) == pytest.approx(sum(gaps[-k:]) / k)
    assert math.isnan(tbt_from_runs([]))  # no gap, no TBT (core.stats: NaN)


def _req(rid: int, remaining: int, t_first: float) -> SimRequest:
    r = SimRequest(rid, 0.0, 100, remaining + 1, (rid,))
    r.last_tok = t_first
    return r


def test_decode_batch_epochs_hand_computed() -> None:
    """Iterations take 1 s + 0.5 s per extra sequence. A (3 tokens) starts at t=0; B (2 tokens)
    is ready at t=1.5 and joins at the boundary t=2; from then iterations take 1.5 s."""
    eq = EventQueue()
    done: dict[int, float] = {}
    batch = DecodeBatch(
        eq, DecodeCoefficients(0.5, 0.5, 0.0), lambda t, r: done.__setitem__(r.rid, t)
    )
    a, b = _req(1, 3, 0.0), _req(2, 2, 1.5)
    batch.add(0.0, a)
    eq.schedule(1.5, Prio.READY, lambda now, r: batch.add(now, r), b)
    eq.run()
    # A: tokens at 1, 2, then 3.5 (batch of 2). B: tokens at 3.5, 4.5 (alone again).
    assert done == {1: pytest.approx(3.5), 2: pytest.approx(4.5)}
    assert a.remaining == 0 and b.remaining == 0
    assert tbt_from_runs(a.gaps) == pytest.approx(1.5)  # gaps 1, 1, 1.5 -> top 1
    assert tbt_from_runs(b.gaps) == pytest.approx(2.0)  # gaps 3.5-1.5=2.0, 1.0
    assert batch.size == 0


def test_decode_batch_context_growth_is_arithmetic() -> None:
    eq = EventQueue()
    out: list[float] = []
    batch = DecodeBatch(eq, DecodeCoefficients(0.0, 0.0, 1.0), lambda t, r: out.append(t))
    r = SimRequest(0, 0.0, 9, 4, (0,))  # ctx starts at 10; 3 decode steps of 10, 11, 12 s
    r.last_tok = 0.0
    batch.add(0.0, r)
    eq.run()
    assert out == [pytest.approx(33.0)]
    assert batch.steps_done(0.0) == 0
