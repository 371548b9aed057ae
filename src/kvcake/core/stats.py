"""The statistics every report computes the same way: a percentile and the paper's TBT.

One convention for "no data": NaN. A percentile of nothing is NaN (NaNs in the input are
dropped first, so "not reached" entries of the simulator's arrays do not count), and so is the
TBT of a request that has no inter-token gap (one output token): it has no time between
tokens, is left out of TBT statistics, and meets any TBT SLO (``meets_slo``).

Pure numpy: the simulator and the conductor import it (no sockets, no torch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np

TBT_SHARE = 0.1  # the paper's TBT (§5): the mean of the longest 10% of a request's gaps


def percentile(
    values: Sequence[float] | np.ndarray | Iterable[float],
    q: float,
    method: Literal["linear", "lower", "higher"] = "linear",
) -> float:
    """The ``q``-th percentile (``q`` in [0, 100]) of ``values`` without their NaNs; NaN when
    none are left. ``method``: numpy's; "linear" interpolates (reports), "lower"/"higher" pick
    a sample (the proxy's admission margin and live medians, which must be a seen value)."""
    a = np.asarray(values if isinstance(values, (Sequence, np.ndarray)) else list(values), float)
    a = a[~np.isnan(a)]
    return float(np.percentile(a, q, method=method)) if a.size else math.nan


def tbt_count(gaps: int) -> int:
    """How many of ``gaps`` inter-token gaps the paper's TBT averages: the longest
    ``ceil(10%)``, at least one."""
    return max(1, math.ceil(TBT_SHARE * gaps))


def tbt_counts(gaps: np.ndarray) -> np.ndarray:
    """:func:`tbt_count` of many requests at once."""
    return np.maximum(1, np.ceil(TBT_SHARE * gaps).astype(np.int64))


def tbt_of_gaps(gaps: Sequence[float] | np.ndarray) -> float:
    """The paper's TBT: the mean of the longest :func:`tbt_count` gaps; NaN without gaps."""
    g = np.asarray(gaps, dtype=float)
    if not g.size:
        return math.nan
    k = tbt_count(g.size)
    return float(np.partition(g, g.size - k)[g.size - k :].mean())


def tbt_of_times(times: Sequence[float] | np.ndarray) -> float:
    """:func:`tbt_of_gaps` of the gaps between consecutive token arrival ``times``."""
    return tbt_of_gaps(np.diff(np.asarray(times, dtype=float)))


def meets_slo(value: float | np.ndarray, slo: float) -> np.ndarray:
    """Within ``slo`` (elementwise; ``bool()`` of it for one value); NaN (no value: a request
    without gaps has no TBT) is within any SLO."""
    with np.errstate(invalid="ignore"):
        return np.asarray(~(np.asarray(value, dtype=float) > slo))
