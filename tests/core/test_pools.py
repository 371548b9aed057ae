"""Pre-started thread pools: the thread count is fixed from the start (a soak's leak check
must not see a pool growing to its bound)."""

from __future__ import annotations

import threading

import pytest

from kvcake.core.pools import started_pool


def _named(prefix: str) -> int:
    return sum(t.name.startswith(prefix) for t in threading.enumerate())


def test_every_worker_runs_before_any_task_and_none_is_added_later() -> None:
    pool = started_pool(4, "t-pool")
    try:
        assert _named("t-pool") == 4
        gate = threading.Barrier(5)  # four tasks at once only if four workers exist
        futs = [pool.submit(gate.wait, 5) for _ in range(4)]
        gate.wait(5)
        assert len({f.result(5) for f in futs}) == 4  # distinct arrival indices: all ran at once
        for _ in range(50):
            pool.submit(sum, [1, 2]).result(5)
        assert _named("t-pool") == 4
    finally:
        pool.shutdown(wait=True)
    assert _named("t-pool") == 0


def test_a_pool_without_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        started_pool(0, "t-none")
