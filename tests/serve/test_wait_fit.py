"""Queue-wait and decode-KV-wait calibration (issue 10 §5): the TTFT the conductor predicts
includes the queue as it really behaved, not the bare sum of predicted services."""

from __future__ import annotations

import random

import pytest

from kvcake.core.ids import InstanceId
from kvcake.proxy.state import LiveCluster, Pending
from kvcake.serve.online_fit import RecentWait, WaitFit, WaitModel


def test_no_samples_is_the_identity() -> None:
    m = WaitFit().model()
    assert (m.a, m.b, m.samples) == (0.0, 1.0, 0) and m.predict(2.0) == 2.0


def test_a_queue_slower_than_predicted_is_learned() -> None:
    """Waits 1.6x the predicted work ahead plus 0.3 s (contention the service fit misses)."""
    rng = random.Random(3)
    fit = WaitFit()
    for _ in range(40):
        q = rng.uniform(0.0, 4.0)
        fit.add(q, 0.3 + 1.6 * q + rng.gauss(0, 0.02))
    m = fit.model()
    assert m.a == pytest.approx(0.3, abs=0.05) and m.b == pytest.approx(1.6, abs=0.05)
    assert m.predict(3.0) == pytest.approx(0.3 + 4.8, rel=0.03)
    assert m.error_s < 0.05 and m.samples == 40


def test_few_samples_scale_by_the_median_ratio() -> None:
    fit = WaitFit()
    for q in (1.0, 2.0):
        fit.add(q, 2.0 * q)
    assert fit.model().predict(4.0) == pytest.approx(8.0)


def test_bad_samples_are_ignored_and_the_window_is_bounded() -> None:
    fit = WaitFit(window=8)
    fit.add(-1.0, 1.0)
    fit.add(1.0, float("nan"))
    assert fit.model().samples == 0
    for i in range(20):
        fit.add(1.0 + i, 1.0 + i)
    m = fit.model()
    assert m.samples == 8 and m.predict(5.0) == pytest.approx(5.0)


def test_a_fit_never_predicts_negative_waits() -> None:
    fit = WaitFit()
    for q, w in ((0.0, 0.5), (1.0, 0.4), (2.0, 0.2), (3.0, 0.1), (4.0, 0.0)):
        fit.add(q, w)  # waits shrinking with the queue: not a queue effect -> a constant
    m = fit.model()
    assert m.b >= 0 and all(m.predict(q) >= 0 for q in (0.0, 1.0, 10.0))


def test_recent_wait_follows_a_burst_and_fades() -> None:
    w = RecentWait(alpha=0.5, half_life_s=2.0)
    for _ in range(6):
        w.add(1.0, now=100.0)
    assert w.value_at(100.0) == pytest.approx(1.0, abs=0.02)
    assert w.value_at(102.0) == pytest.approx(0.5, abs=0.01)
    assert w.value_at(140.0) < 1e-4
    w.add(0.0, now=100.0)
    assert w.value_at(100.0) == pytest.approx(0.5, abs=0.02)


def _cluster() -> LiveCluster:
    return LiveCluster(instances={}, block_tokens=32, kv_bytes_per_token=1024, link_bandwidth=1e9)


def test_snapshot_queue_uses_the_fit_only_when_work_is_queued() -> None:
    c, p = _cluster(), InstanceId("prefill-0")
    assert c.expected_queue_s(p, 10.0) == 0.0  # never seen: nothing queued
    for q in (1.0, 2.0, 3.0, 4.0):
        c.record_wait(p, q, 2.0 * q)
    c.pending[p] = Pending(prefill_s=1.5, prefill_requests=2)
    assert c.expected_queue_s(p, 10.0) == pytest.approx(3.0)
    c.pending[p] = Pending()  # the fit's offset does not apply to an empty queue
    assert c.expected_queue_s(p, 10.0) == 0.0
    gauges = {(s, k): v for s, k, v in c.wait_gauges()}
    assert gauges == {}  # no live prefill instance listed: nothing exported


def test_wait_model_defaults() -> None:
    assert WaitModel().predict(1.25) == 1.25 and WaitModel(a=-5.0, b=0.0).predict(1.0) == 0.0


def test_the_margin_learns_only_from_calibrated_predictions() -> None:
    c, p = _cluster(), InstanceId("prefill-0")
    assert c.queue_calibrated(p)  # no queue: nothing to calibrate
    c.pending[p] = Pending(prefill_s=2.0, prefill_requests=3)
    assert not c.queue_calibrated(p)  # a queue, and no measured waits yet
    for q in (1.0, 2.0, 3.0, 4.0):
        c.record_wait(p, q, q)
    assert c.queue_calibrated(p)
