"""The fleet benchmark's pure pieces: seeded arrivals and the capacity read off an SLO sweep
(the benchmark's figures come from ``kvcake bench vllm -- --part slo``)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

FLEET = runpy.run_path(str(Path(__file__).resolve().parents[3] / "benchmarks" / "vllm_fleet.py"))


def sweep(**attained: float) -> dict[str, dict[str, float]]:
    return {
        rate.removeprefix("r").replace("_", "."): {"attained": a} for rate, a in attained.items()
    }


def test_arrivals_are_seeded_poisson_at_the_rate() -> None:
    at = FLEET["arrivals"](2001, 2.0, seed=7)
    assert at == FLEET["arrivals"](2001, 2.0, seed=7) and at != FLEET["arrivals"](2001, 2.0, seed=8)
    assert at[0] == 0.0 and at == sorted(at)
    assert at[-1] / 2000 == pytest.approx(0.5, rel=0.1)  # mean gap 1 / rate


def test_capacity_interpolates_where_attainment_first_falls_below_the_target() -> None:
    capacity = FLEET["capacity"]
    assert capacity(sweep(r1=1.0, r2=0.95, r3=0.5), 0.9) == (pytest.approx(2 + 0.05 / 0.45), "=")
    # the first crossing counts, even if a noisy higher rate recovers
    assert capacity(sweep(r1=1.0, r2=0.7, r3=0.95), 0.9) == (pytest.approx(1 + 0.1 / 0.3), "=")
    assert capacity(sweep(r0_5=0.8, r1=0.6), 0.9) == (0.5, "<")  # below at the lowest rate
    assert capacity(sweep(r0_5=0.95, r1=0.92), 0.9) == (1.0, ">=")  # never below: a bound
