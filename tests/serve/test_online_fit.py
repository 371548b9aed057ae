"""The online cost-model fit: seeded, robust with few samples, exact with enough."""

from __future__ import annotations

import random

from kvcake.core.costmodel import DecodeCoefficients, PrefillCoefficients
from kvcake.serve.online_fit import OnlineFit

TRUE_P = PrefillCoefficients(0.01, 0.002, 3e-7)
TRUE_D = DecodeCoefficients(0.02, 0.004, 2e-6)


def test_no_samples_gives_the_seed() -> None:
    f = OnlineFit(TRUE_P, TRUE_D).fitted()
    assert f.prefill == (0.01, 0.002, 3e-7) and f.prefill_samples == 0


def test_few_samples_scale_the_seed() -> None:
    """A seed 7x too slow (the SmolLM2 preset vs this CPU) is corrected by two samples."""
    seed = PrefillCoefficients(0.07, 0.014, 2.1e-6)
    fit = OnlineFit(seed, TRUE_D)
    for n in (500, 3000):
        fit.add_prefill(n, 0, TRUE_P.time(n, 0))
    c = PrefillCoefficients(*fit.fitted().prefill)
    assert abs(c.time(3000, 0) - TRUE_P.time(3000, 0)) / TRUE_P.time(3000, 0) < 0.02


def test_enough_samples_fit_the_shape() -> None:
    """A seed with the wrong shape (no quadratic term) is replaced by the least-squares fit."""
    rng = random.Random(1)
    fit = OnlineFit(PrefillCoefficients(0.5, 0.001, 0.0), DecodeCoefficients(1.0, 0.0, 0.0))
    for _ in range(20):
        n, p = rng.randrange(100, 6000), rng.randrange(0, 50)
        fit.add_prefill(n, p, TRUE_P.time(n, p) * rng.uniform(0.98, 1.02))
        b, c = rng.randrange(1, 16), rng.randrange(100, 20000)
        fit.add_decode(b, c, TRUE_D.time(b, c) * rng.uniform(0.98, 1.02))
    f = fit.fitted()
    pc, dc = PrefillCoefficients(*f.prefill), DecodeCoefficients(*f.decode)
    for n in (200, 2000, 6000):
        assert abs(pc.time(n, 0) / TRUE_P.time(n, 0) - 1) < 0.05
    assert abs(dc.time(8, 8000) / TRUE_D.time(8, 8000) - 1) < 0.05
    assert f.prefill_error < 0.05 and f.decode_samples == 20


def test_windows_are_bounded_and_bad_samples_ignored() -> None:
    fit = OnlineFit(TRUE_P, TRUE_D, window=8)
    for _ in range(100):
        fit.add_prefill(100, 0, 0.2)
        fit.add_prefill(100, 100, 0.2)  # nothing computed: not a sample
        fit.add_decode(0, 10, 0.1)  # empty batch: not a sample
    f = fit.fitted()
    assert f.prefill_samples == 8 and f.decode_samples == 0


def test_collinear_decode_samples_keep_the_seed_shape() -> None:
    """Steps whose context grows with the batch cannot separate the batch and context terms:
    no full fit (it would extrapolate wildly, e.g. a 1 s TBT for a 14 ms step)."""
    fit = OnlineFit(TRUE_P, TRUE_D)
    for b in (1, 2, 4, 8, 1, 2, 4, 8):
        fit.add_decode(b, 129 * b, TRUE_D.time(b, 129 * b) * 1.5)
    dc = DecodeCoefficients(*fit.fitted().decode)
    for b, c in ((1, 100), (16, 60000)):
        assert abs(dc.time(b, c) / (1.5 * TRUE_D.time(b, c)) - 1) < 0.05  # the scaled seed
