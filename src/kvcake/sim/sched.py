"""The bridge to :mod:`kvcake.conductor`: the simulator schedules with the very
:class:`~kvcake.conductor.Conductor` the live proxy uses, built from the simulator's settings
(predictors from the same ``core.costmodel`` preset the simulated hardware runs on)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from kvcake.conductor import Conductor, Predictors, PrefixIndex
from kvcake.conductor.predictors import DecodeTBTModel, PrefillTimeModel, TransferTimeModel
from kvcake.core.costmodel import CostModel

if TYPE_CHECKING:
    from kvcake.sim.config import SimConfig

Scheduler = Conductor


def make_index() -> PrefixIndex:
    """The conductor's fast prefix index (a drop-in ``core.api.KVIndex``)."""
    return PrefixIndex()


def build_scheduler(cfg: SimConfig, *, colocated: bool) -> Conductor:
    ccfg = replace(cfg.conductor, colocated=colocated)
    return Conductor(ccfg, noisy_predictors(cfg.cost_model(), cfg.predictor_noise, ccfg.seed))


def noisy_predictors(cm: CostModel, noise: float, seed: int = 0, n: int = 64) -> Predictors:
    """Predictors as the live proxy's calibrated admission gets them: least-squares fits of
    ``n`` timing samples each, measured with multiplicative noise ``N(1, noise)`` (clipped at
    0.05x). ``noise == 0`` returns the cost model's own (exact) predictors."""
    if noise <= 0:
        return Predictors.from_cost_model(cm)
    rng = np.random.default_rng([seed, 17])

    def jitter() -> float:
        return max(0.05, 1.0 + noise * float(rng.standard_normal()))

    pre = []
    for _ in range(n):
        L = int(rng.integers(64, 32_768))
        P = int(rng.integers(0, L)) if rng.random() < 0.5 else 0
        pre.append((L, P, cm.prefill_time(L, P) * jitter()))
    dec = []
    for _ in range(n):
        b = int(rng.integers(1, 128))
        c = b * int(rng.integers(128, 16_384))
        dec.append((b, c, cm.decode_step_time(b, c) * jitter()))
    return Predictors(PrefillTimeModel.fit(pre), TransferTimeModel(), DecodeTBTModel.fit(dec))
