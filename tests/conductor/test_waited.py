"""Admission judges TTFT from arrival: the time a request already spent in the proxy (body read,
tokenized) counts against the SLO, and a rejection reports the TTFT from arrival."""

from __future__ import annotations

import pytest

from kvcake.conductor import Conductor, ConductorConfig
from kvcake.core.api import Accept, ClusterSnapshot, DecodeState, PrefillState, Reject, RequestView
from kvcake.core.ids import InstanceId, RequestId
from tests.conductor.util import PRED


def _snap(now: float) -> ClusterSnapshot:
    from kvcake.conductor import PrefixIndex

    return ClusterSnapshot(
        now_s=now,
        prefill=(PrefillState(InstanceId("p0"), 0.0),),
        decode=(DecodeState(InstanceId("d0"), 0, 0, 10**7),),
        kv_index=PrefixIndex(), block_tokens=16, kv_bytes_per_token=1, link_bandwidth=1e9,
    )  # fmt: skip


@pytest.mark.parametrize("policy", ["per-stage", "early-rejection", "prediction"])
def test_time_already_waited_counts_against_the_slo(policy: str) -> None:
    probe = Conductor(ConductorConfig(admission_policy="none"), PRED)
    ttft = probe.estimate_ttfts(RequestView(RequestId("x"), 0.0, 2000, ()), _snap(0.0))[0]
    slo = ttft + 0.5
    cfg = ConductorConfig(admission_policy=policy, ttft_slo_s=slo, tbt_slo_s=10.0, ttft_headroom=0)
    c = Conductor(cfg, PRED)
    fresh = c.schedule(RequestView(RequestId("a"), 100.0, 2000, ()), _snap(100.0))
    assert isinstance(fresh, Accept)
    # the same request having spent 1 s in the proxy before placement misses the SLO
    late = c.schedule(RequestView(RequestId("b"), 99.0, 2000, ()), _snap(100.0))
    assert isinstance(late, Reject) and late.reason == "ttft-slo"
    assert late.expected_ttft_s == pytest.approx(1.0 + ttft)


@pytest.mark.parametrize("policy", ["per-stage", "early-rejection", "prediction"])
def test_headroom_rejects_predictions_a_hair_under_the_slo(policy: str) -> None:
    """Predicted 1 % under the SLO: accepted without headroom, rejected with the default 3 %."""
    probe = Conductor(ConductorConfig(admission_policy="none"), PRED)
    ttft = probe.estimate_ttfts(RequestView(RequestId("x"), 0.0, 2000, ()), _snap(0.0))[0]
    for headroom, accepted in ((0.0, True), (ConductorConfig().ttft_headroom, False)):
        cfg = ConductorConfig(admission_policy=policy, ttft_slo_s=ttft / 0.99, tbt_slo_s=10.0,
                              ttft_headroom=headroom)  # fmt: skip
        d = Conductor(cfg, PRED).schedule(RequestView(RequestId("a"), 0.0, 2000, ()), _snap(0.0))
        assert isinstance(d, Accept) is accepted, (headroom, d)
    with pytest.raises(ValueError, match="ttft_headroom"):
        ConductorConfig(ttft_headroom=0.7)
