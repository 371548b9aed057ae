"""The one backoff (kvcake.core.backoff)."""

from __future__ import annotations

import itertools

from kvcake.core.backoff import backoff_s, pauses


def test_doubles_from_the_base_up_to_the_cap() -> None:
    assert [backoff_s(n, 0.5, 30.0) for n in (0, 1, 2, 3, 7, 8)] == [0.5, 0.5, 1.0, 2.0, 30.0, 30.0]
    assert list(itertools.islice(pauses(0.05, 0.2), 5)) == [0.05, 0.1, 0.2, 0.2, 0.2]


def test_a_long_run_of_failures_stays_finite() -> None:
    assert backoff_s(10**6, 1e-3, 5.0) == 5.0
