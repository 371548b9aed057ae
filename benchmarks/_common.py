"""Helpers shared by the benchmark scripts: repeat-and-summarise and machine description."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    median: float
    minimum: float
    maximum: float
    repeats: int


def repeat(fn: Callable[[], float], repeats: int = 5) -> Summary:
    """Run ``fn`` (which returns a measured value) ``repeats`` times; median, min and max."""
    values = [fn() for _ in range(repeats)]
    return Summary(statistics.median(values), min(values), max(values), repeats)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 100]."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return s[k]


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
