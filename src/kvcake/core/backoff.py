"""The one backoff: a pause that doubles with every failure in a row, up to a cap.

Used by every retry loop (the store client's re-puts while memory frees, the HA client following
a new leader, a storage node's heartbeat after failed rounds, the supervisor's restarts).
"""

from __future__ import annotations

from collections.abc import Iterator

_MAX_DOUBLINGS = 60  # 2**60 x any base is past every cap; keeps the float finite


def backoff_s(failures: int, base_s: float, max_s: float) -> float:
    """The pause after ``failures`` failures in a row: ``base_s`` after the first (and for 0),
    doubled after each further one, never more than ``max_s``."""
    return float(min(max_s, base_s * 2 ** min(max(0, failures - 1), _MAX_DOUBLINGS)))


def pauses(base_s: float, max_s: float) -> Iterator[float]:
    """:func:`backoff_s` after 1, 2, 3... failures: the pauses of one retry loop."""
    failures = 1
    while True:
        yield backoff_s(failures, base_s, max_s)
        failures += 1
