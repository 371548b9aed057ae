"""Admission policies: hand-computed accept/reject cases, including the difference between
early rejection (judges decode load now) and prediction-based rejection (judges it at the time
the request would reach decode)."""

from __future__ import annotations

import pytest

from kvcake.conductor import (
    ADMISSION_POLICIES,
    KV_FULL,
    NO_DECODE,
    NO_PREFILL,
    PREDICTED_TBT_SLO,
    TBT_SLO,
    TBT_SLO_AFTER_PREFILL,
    TTFT_SLO,
    AdmissionInput,
    Conductor,
    ConductorConfig,
    DecodeTBTModel,
    make_admission_policy,
)
from kvcake.conductor.admission import PredictionAdmission
from kvcake.core.api import Accept, Reject
from kvcake.core.costmodel import DecodeCoefficients
from kvcake.core.errors import ConfigError, SchedulingError
from kvcake.core.ids import InstanceId, RequestId

from .util import PRED, decode, index_with, pstate, request, snapshot

# Single prefill p0 (empty queue, no cache): TTFT = 1 + 0.01*100 = 2.0 s.
# Decode d0 idle: TBT = 0.01 + 0.001 + 0.0001 = 0.0111 s.


def _conductor(policy: str, **cfg) -> Conductor:  # type: ignore[no-untyped-def]
    return Conductor(ConductorConfig(admission_policy=policy, **cfg), PRED)


def _snap(queued: float = 0.0, decodes=(decode("d0"),)):  # type: ignore[no-untyped-def]
    return snapshot([pstate("p0", queued)], index_with({}), decodes)


def test_registry_names() -> None:
    assert set(ADMISSION_POLICIES) == {"none", "per-stage", "early-rejection", "prediction"}
    with pytest.raises(ConfigError):
        make_admission_policy("nope")
    with pytest.raises(ConfigError):
        make_admission_policy("none", bogus=3)
    p = make_admission_policy("early-rejection", ttft_slo_s=1.0, tbt_slo_s=0.5)
    x = AdmissionInput(request(), 0.0, 2.0, 0.1, True, 1)
    assert p.admit(x) == TTFT_SLO


def test_none_accepts_everything_a_healthy_instance_can_take() -> None:
    c = _conductor("none", ttft_slo_s=0.5, tbt_slo_s=0.001)
    d = c.schedule(request(), _snap(queued=100.0, decodes=(decode("d0", cap=10),)))
    assert isinstance(d, Accept) and d.expected_ttft_s == pytest.approx(102.0)


def test_early_rejection_checks_ttft_tbt_and_kv() -> None:
    c = _conductor("early-rejection", ttft_slo_s=3.0, tbt_slo_s=0.02)
    d = c.schedule(request(), _snap())
    assert isinstance(d, Accept)
    assert (d.expected_ttft_s, d.expected_tbt_s) == (pytest.approx(2.0), pytest.approx(0.0111))
    d = c.schedule(request(), _snap(queued=1.5))  # TTFT 3.5 > 3.0
    assert d == Reject(TTFT_SLO, pytest.approx(3.5), pytest.approx(0.0111))
    busy = decode("d0", running=5, ctx=5_000)  # 0.01 + 0.006 + 0.0051 = 0.0211 > 0.02
    d = c.schedule(request(), _snap(decodes=(busy,)))
    assert isinstance(d, Reject) and d.reason == TBT_SLO
    assert d.expected_tbt_s == pytest.approx(0.0211)
    d = c.schedule(request(), _snap(decodes=(decode("d0", cap=100),)))
    assert isinstance(d, Reject) and d.reason == KV_FULL


def test_per_stage_rechecks_tbt_after_prefill() -> None:
    c = _conductor("per-stage", ttft_slo_s=3.0, tbt_slo_s=0.02)
    busy = decode("d0", running=5, ctx=5_000)
    # At arrival per-stage only judges the prefill stage: the busy decoder does not matter.
    d = c.schedule(request(), _snap(decodes=(busy,)))
    assert isinstance(d, Accept)
    assert c.schedule(request(), _snap(queued=1.5)) == Reject(
        TTFT_SLO, pytest.approx(3.5), pytest.approx(0.0111)
    )
    c.on_prefill_done(RequestId("r"), 2.0)
    # After prefill: running 5 + this one, ctx 5_000 + 100 -> 0.01 + 0.006 + 0.0051 = 0.0211.
    r = c.recheck_decode(request(), d, _snap(decodes=(busy,)))
    assert r == Reject(TBT_SLO_AFTER_PREFILL, pytest.approx(2.0), pytest.approx(0.0211))
    # Pending requests (still prefilling) do not count at this point.
    calm = decode("d0", running=1, ctx=100, pending_requests=50, pending_context_tokens=99_000)
    r = c.recheck_decode(request(), d, _snap(decodes=(calm,)))
    assert isinstance(r, Accept) and r.expected_tbt_s == pytest.approx(0.01 + 0.002 + 0.0002)
    assert (r.prefill, r.decode) == (d.prefill, d.decode)


def test_recheck_only_rejects_for_per_stage() -> None:
    busy = decode("d0", running=50, ctx=50_000)
    for policy in ("none", "early-rejection", "prediction"):
        c = _conductor(policy, tbt_slo_s=0.02)
        d = c.schedule(request(), _snap())
        assert isinstance(d, Accept), policy
        r = c.recheck_decode(request(), d, _snap(decodes=(busy,)))
        assert isinstance(r, Accept) and r.expected_tbt_s > 0.02, policy
    c = _conductor("early-rejection")
    d = c.schedule(request(), _snap())
    assert isinstance(d, Accept)
    r = c.recheck_decode(request(), d, _snap(decodes=(decode("d0", healthy=False),)))
    assert isinstance(r, Reject) and r.reason == NO_DECODE
    with pytest.raises(SchedulingError):
        c.recheck_decode(request(), d, _snap(decodes=(decode("other"),)))


def _pred(tbt_slo: float = 0.035) -> PredictionAdmission:
    # tbt(batch, ctx) = 0.01 + 0.01 * batch: <= 0.035 for up to 2 requests per decode instance.
    model = DecodeTBTModel(DecodeCoefficients(0.01, 0.01, 0.0))
    return PredictionAdmission(30.0, tbt_slo, model, uniform_decode_s=10.0)


def _accept(ttft: float) -> Accept:
    return Accept(InstanceId("p0"), InstanceId("d0"), 0, (), ttft, 0.0)


def test_prediction_counts_requests_in_decode_at_arrival_time() -> None:
    p = _pred()
    a, b = request(rid="a"), request(rid="b")
    p.on_accept(a, _accept(2.0), 0.0)  # prefill ends 2, decode ends 12
    p.on_accept(b, _accept(5.0), 0.0)  # prefill ends 5, decode ends 15
    new = request(rid="c")

    def admit(ttft: float, k: int = 1) -> str | None:
        return p.admit(AdmissionInput(new, 0.0, ttft, 0.0, True, k))

    assert p.predicted_tbt(1.0, new, 1) == pytest.approx(0.02)  # nobody in decode yet
    assert admit(1.0) is None
    assert p.predicted_tbt(6.0, new, 1) == pytest.approx(0.04)  # a, b and the new one
    assert admit(6.0) == PREDICTED_TBT_SLO
    assert admit(6.0, k=2) is None  # spread over two decode instances: 1.5 each -> 0.025
    assert admit(13.0) is None  # a finished decoding at 12
    # Real prefill end replaces the prediction: b decodes from 3 to 13.
    p.on_prefill_done(RequestId("b"), 3.0)
    assert p.predicted_tbt(13.0, new, 1) == pytest.approx(0.02)
    assert admit(31.0) == TTFT_SLO
    p.on_decode_done(RequestId("a"), 12.0)
    p.on_abort(RequestId("b"))
    p.on_abort(RequestId("unknown"))
    assert p.in_flight == 0
    assert p.predicted_tbt(6.0, new, 1) == pytest.approx(0.02)


def test_prediction_learns_the_uniform_decode_time() -> None:
    """Without a configured t_d: expected_output * TBT until a request finishes, then the mean
    of the observed decode durations (prefill end -> decode end)."""
    model = DecodeTBTModel(DecodeCoefficients(0.01, 0.01, 0.0))
    p = PredictionAdmission(30.0, 0.035, model)
    r = request(rid="a")
    assert p.decode_duration(r, 0.02) == pytest.approx(r.expected_output * 0.02)
    p.on_accept(r, _accept(2.0), 0.0)
    p.on_prefill_done(RequestId("a"), 3.0)
    p.on_decode_done(RequestId("a"), 9.0)  # decoded for 6 s
    p.on_accept(request(rid="b"), _accept(1.0), 10.0)
    p.on_decode_done(RequestId("b"), 21.0)  # prefill predicted to end at 11: 10 s
    assert p.decode_duration(request(rid="c"), 0.02) == pytest.approx(8.0)
    p.on_accept(request(rid="c"), _accept(1.0), 30.0)  # decodes 31 .. 39 (learned 8 s)
    new = request(rid="d")
    assert p.predicted_tbt(38.5, new, 1) == pytest.approx(0.03)
    assert p.predicted_tbt(39.5, new, 1) == pytest.approx(0.02)
    p.on_abort(RequestId("c"))  # an abort teaches nothing
    assert p.decode_duration(new, 0.02) == pytest.approx(8.0)


def test_prediction_bookkeeping_grows_and_reuses_slots() -> None:
    p = _pred()
    for i in range(200):
        p.on_accept(request(rid=f"r{i}"), _accept(1.0), 0.0)
    p.on_accept(request(rid="r0"), _accept(1.0), 0.0)  # the same id is tracked once
    assert p.in_flight == 200
    assert p.predicted_tbt(5.0, request(), 200) == pytest.approx(0.01 + 0.01 * 201 / 200)
    for i in range(150):
        p.on_decode_done(RequestId(f"r{i}"), 11.0)
    assert p.in_flight == 50
    assert p.predicted_tbt(5.0, request(), 1) == pytest.approx(0.01 + 0.01 * 51)


def test_prediction_vs_early_rejection_through_the_conductor() -> None:
    """Decode is idle now, but two accepted requests will be decoding when a third reaches
    decode: early rejection accepts it (judges now), prediction rejects it (judges then)."""
    decode_model = DecodeTBTModel(DecodeCoefficients(0.01, 0.01, 0.0))
    pred = type(PRED)(PRED.prefill, PRED.transfer, decode_model)
    cfg = {"tbt_slo_s": 0.035, "uniform_decode_s": 100.0}
    early = Conductor(ConductorConfig(admission_policy="early-rejection", **cfg), pred)
    predict = Conductor(ConductorConfig(admission_policy="prediction", **cfg), pred)
    results = {}
    for name, c in (("early", early), ("predict", predict)):
        out = []
        for i in range(3):
            out.append(c.schedule(request(rid=f"r{i}"), _snap()))
        results[name] = out
    assert all(isinstance(d, Accept) for d in results["early"])
    assert [type(d).__name__ for d in results["predict"]] == ["Accept", "Accept", "Reject"]
    last = results["predict"][2]
    assert isinstance(last, Reject) and last.reason == PREDICTED_TBT_SLO
    # Once one of them finishes decoding there is room again.
    predict.on_decode_done(RequestId("r0"), 1.0)
    assert isinstance(predict.schedule(request(rid="r3"), _snap()), Accept)


def test_empty_and_unhealthy_clusters_reject() -> None:
    c = _conductor("none")
    assert c.schedule(request(), snapshot([], index_with({}))) == Reject(NO_PREFILL)
    snap = snapshot([pstate("p0", 0.0, healthy=False)], index_with({}))
    assert c.schedule(request(), snap) == Reject(NO_PREFILL)
    d = c.schedule(request(), _snap(decodes=(decode("d0", healthy=False),)))
    assert isinstance(d, Reject) and d.reason == NO_DECODE
    assert d.expected_ttft_s == pytest.approx(2.0)
