from __future__ import annotations

import numpy as np
import pytest

from kvcake.conductor import DecodeTBTModel, Predictors, PrefillTimeModel, TransferTimeModel
from kvcake.core.costmodel import (
    DecodeCoefficients,
    PrefillCoefficients,
    preset,
    save_calibration,
)
from kvcake.core.errors import ConfigError

from .util import decode


def test_prefill_time_polynomial_by_hand() -> None:
    m = PrefillTimeModel(PrefillCoefficients(c0=0.5, c1=0.01, c2=1e-4))
    # L=100, P=40: 0.5 + 0.01*60 + 1e-4*(10000-1600) = 0.5 + 0.6 + 0.84
    assert m.time(100, 40) == pytest.approx(1.94)
    assert m.time(100, 100) == 0.0  # fully cached: nothing to compute
    got = m.times(100, np.array([0, 40, 100]))
    assert got == pytest.approx([0.5 + 1.0 + 1.0, 1.94, 0.0])
    assert m.times(100, np.array([0, 40]), any_full=False) == pytest.approx([2.5, 1.94])


def test_prefill_fit_recovers_coefficients() -> None:
    true = PrefillCoefficients(c0=0.2, c1=3e-4, c2=2e-8)
    samples = [(L, P, true.time(L, P)) for L in (512, 2048, 8192, 16384) for P in (0, 256, 500)]
    m = PrefillTimeModel.fit(samples)
    assert m.coefficients.c0 == pytest.approx(0.2, rel=1e-6)
    assert m.coefficients.c1 == pytest.approx(3e-4, rel=1e-6)
    assert m.coefficients.c2 == pytest.approx(2e-8, rel=1e-6)
    assert m.fit_error < 1e-9
    with pytest.raises(ValueError):
        PrefillTimeModel.fit([(10, 10, 1.0)])  # no sample with new tokens


def test_queue_seconds_sums_predicted_prefills() -> None:
    m = PrefillTimeModel(PrefillCoefficients(c0=1.0, c1=0.01, c2=0.0))
    # (1 + 0.01*100) + (1 + 0.01*50) + 0 (fully cached)
    assert m.queue_seconds([(100, 0), (100, 50), (30, 30)]) == pytest.approx(3.5)
    assert m.queue_seconds([]) == 0.0


def test_transfer_time() -> None:
    t = TransferTimeModel(latency_s=0.5)
    assert t.time(1000, 100.0) == pytest.approx(10.5)
    assert t.time(0, 100.0) == 0.0
    assert t.times(np.array([0.0, 1000.0]), np.array([1.0, 100.0])) == pytest.approx([0, 10.5])
    assert t.token_times(np.array([0, 10]), 0.1) == pytest.approx([0.0, 1.5])
    assert TransferTimeModel().token_times(np.array([0, 10]), 0.1) == pytest.approx([0.0, 1.0])
    with pytest.raises(ValueError):
        t.time(10, 0.0)
    with pytest.raises(ValueError):
        TransferTimeModel(latency_s=-1.0)


def test_decode_tbt_counts_pending_requests() -> None:
    m = DecodeTBTModel(DecodeCoefficients(d0=0.01, d1=0.001, d2=1e-6))
    s = decode(running=10, ctx=10_000, pending_requests=2, pending_context_tokens=1_000)
    # batch 10+2+1 = 13, context 11_000 + 100
    assert m.predict(s, add_requests=1, add_tokens=100) == pytest.approx(0.01 + 0.013 + 0.0111)
    assert m.step_time(0, 0) == 0.0
    assert m.step_time(2.5, 1000) == pytest.approx(0.01 + 0.0025 + 0.001)


def test_decode_fit() -> None:
    true = DecodeCoefficients(d0=0.02, d1=0.002, d2=3e-7)
    samples = [(b, c, true.time(b, c)) for b in (1, 4, 16, 64) for c in (100, 5000, 70000)]
    m = DecodeTBTModel.fit(samples)
    assert (m.coefficients.d0, m.coefficients.d1, m.coefficients.d2) == pytest.approx(
        (0.02, 0.002, 3e-7)
    )


def test_predictors_from_cost_model_and_calibration(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cm = preset("llama3-70b/8xA800")
    p = Predictors.from_cost_model(cm, transfer_latency_s=0.001)
    assert p.prefill.time(8192, 0) == pytest.approx(cm.prefill_time(8192, 0))
    assert p.decode.step_time(8, 80_000) == pytest.approx(cm.decode_step_time(8, 80_000))
    assert p.transfer.latency_s == 0.001
    assert Predictors.from_preset().prefill.coefficients == cm.prefill
    path = tmp_path / "cal.json"
    save_calibration(cm, path)
    assert Predictors.from_calibration(path).prefill.coefficients == cm.prefill
    assert PrefillTimeModel.from_calibration(path).coefficients == cm.prefill
    assert DecodeTBTModel.from_calibration(path).coefficients == cm.decode
    path.write_text("{not json")
    with pytest.raises(ConfigError):
        Predictors.from_calibration(path)
    with pytest.raises(ConfigError):
        Predictors.from_calibration(tmp_path / "missing.json")
