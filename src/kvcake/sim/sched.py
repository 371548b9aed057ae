"""The bridge to :mod:`kvcake.conductor`: the simulator schedules with the very
:class:`~kvcake.conductor.Conductor` the live proxy uses, built from the simulator's settings
(predictors from the same ``core.costmodel`` preset the simulated hardware runs on)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcake.conductor import Conductor, ConductorConfig, Predictors, PrefixIndex

if TYPE_CHECKING:
    from kvcake.sim.config import SimConfig

Scheduler = Conductor


def make_index() -> PrefixIndex:
    """The conductor's fast prefix index (a drop-in ``core.api.KVIndex``)."""
    return PrefixIndex()


def build_scheduler(cfg: SimConfig, *, colocated: bool) -> Conductor:
    ccfg = ConductorConfig(
        prefill_policy=cfg.prefill_policy,
        admission_policy=cfg.admission_policy,
        ttft_slo_s=cfg.ttft_slo_s,
        tbt_slo_s=cfg.tbt_slo_s,
        kvcache_balancing_threshold=cfg.kvcache_balancing_threshold,
        uniform_decode_s=cfg.uniform_decode_s,
        seed=cfg.seed,
        colocated=colocated,
    )
    return Conductor(ccfg, Predictors.from_preset(cfg.preset))
