"""The simulator's fast paths give the results of the plain computations they replace."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kvcake.sim.request import tbt_from_runs, tbt_many


def _naive(runs: list[tuple[int, float, float]]) -> float:
    gaps = sorted(g0 + inc * j for n, g0, inc in runs for j in range(n))
    if not gaps:
        return math.nan  # no gap, no TBT
    k = max(1, math.ceil(0.1 * len(gaps)))
    return sum(gaps[-k:]) / k


def test_tbt_many_matches_expanding_every_gap() -> None:
    rng = random.Random(7)
    lists: list[list[tuple[int, float, float]]] = [[]]
    for _ in range(300):
        runs = []
        for _ in range(rng.randint(1, 12)):
            n = rng.choice([1, 1, 2, 3, 7, 40, 200])
            inc = rng.choice([0.0, 1e-4, 3e-3, -2e-3])  # decreasing runs too
            runs.append((n, rng.uniform(0.01, 0.2), inc))
        lists.append(runs)
    got = tbt_many(lists)
    want = np.array([_naive(r) for r in lists])
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True)
    assert [tbt_from_runs(r) for r in lists] == pytest.approx(
        list(want), rel=1e-9, abs=1e-12, nan_ok=True
    )
