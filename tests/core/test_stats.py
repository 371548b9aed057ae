"""The one percentile and the one TBT (kvcake.core.stats): values, and NaN for no data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvcake.core.stats import (
    meets_slo,
    percentile,
    tbt_count,
    tbt_counts,
    tbt_of_gaps,
    tbt_of_times,
)


def test_percentile_interpolates_and_drops_nan() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert percentile(np.array([1.0, math.nan, 3.0]), 50) == pytest.approx(2.0)


@pytest.mark.parametrize("empty", [[], np.array([]), np.array([math.nan, math.nan])])
def test_percentile_of_nothing_is_nan(empty: list[float] | np.ndarray) -> None:
    assert math.isnan(percentile(empty, 90))


def test_tbt_is_the_mean_of_the_longest_tenth_of_the_gaps() -> None:
    times = [0.0, *[0.1 * i for i in range(1, 20)], 3.0]  # 19 gaps of 0.1 and one of 1.1
    assert tbt_of_times(times) == pytest.approx((1.1 + 0.1) / 2)  # ceil(10% of 20) = 2 gaps
    assert tbt_of_gaps([0.5]) == 0.5
    assert [tbt_count(n) for n in (1, 10, 11, 20)] == [1, 1, 2, 2]
    assert tbt_counts(np.array([0, 1, 11, 20])).tolist() == [1, 1, 2, 2]


def test_no_gap_no_tbt_and_it_meets_any_slo() -> None:
    assert math.isnan(tbt_of_times([0.0])) and math.isnan(tbt_of_times([]))
    assert math.isnan(tbt_of_gaps([]))
    assert bool(meets_slo(math.nan, 0.0)) and bool(meets_slo(0.1, 0.1))
    assert not bool(meets_slo(0.2, 0.1))
    assert meets_slo(np.array([0.05, math.nan, 0.3]), 0.1).tolist() == [True, True, False]


def test_sample_picking_methods_match_the_live_stats() -> None:
    """The proxy's admission margin and live medians must be a value seen: "lower"/"higher"
    pick the same sample the hand-written rank picks did."""
    import collections

    for n in range(1, 30):
        xs = [float((7 * i) % 31) for i in range(n)]
        s = sorted(xs)
        assert percentile(xs, 90, method="lower") == s[int(0.9 * (n - 1))]
        assert percentile(collections.deque(xs), 50, method="higher") == s[n // 2]
        assert percentile(xs, 90, method="higher") == s[min(n - 1, int(n * 0.9))]
