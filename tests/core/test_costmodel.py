import math
from pathlib import Path

import pytest

from kvcake.core import costmodel as cmod
from kvcake.core.errors import ConfigError


def test_llama70b_kv_bytes_per_token_is_320kb() -> None:
    assert cmod.LLAMA3_70B.kv_bytes_per_token == 320 * 1024
    assert cmod.SMOLLM2_135M.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4


def test_eq1_hand_computed() -> None:
    m = cmod.ModelSpec("t", layers=2, hidden=10, heads=2, kv_heads=1, params=1e3)
    # l*(a*n^2*d + b*n*d^2) = 2*(4*9*10 + 22*3*100) = 2*(360 + 6600) = 13920
    assert m.prefill_flops(3) == 13920


def test_analytic_prefill_matches_eq1() -> None:
    cm = cmod.preset("llama3-70b/8xA800")
    n = 8192
    expect = (
        cmod.LLAMA3_70B.prefill_flops(n) / cmod.A800X8.effective_flops + cmod.A800X8.step_overhead
    )
    assert cm.prefill_time(n) == pytest.approx(expect, rel=1e-12)
    # A cached prefix saves exactly the flops of the prefix.
    saved = cmod.LLAMA3_70B.prefill_flops(4096) / cmod.A800X8.effective_flops
    assert cm.prefill_time(n) - cm.prefill_time(n, 4096) == pytest.approx(saved, rel=1e-9)
    assert cm.prefill_time(n, n) == 0.0
    with pytest.raises(ValueError):
        cm.prefill_time(10, 11)


def test_chunked_prefill_sums_chunks() -> None:
    cm = cmod.preset("llama3-70b/8xA800")
    whole = cm.prefill_time(4000)
    chunked = cm.chunked_prefill_time(4000, 0, 1000)
    # Same FLOPs (the quadratic terms telescope) plus one overhead per extra chunk.
    assert chunked == pytest.approx(whole + 3 * cmod.A800X8.step_overhead, rel=1e-9)


def test_reuse_bandwidth_thresholds_match_paper() -> None:
    a800 = cmod.min_reuse_bandwidth(cmod.LLAMA3_70B, cmod.A800X8, 8192)
    h800 = cmod.min_reuse_bandwidth(cmod.LLAMA3_70B, cmod.H800X8, 8192)
    assert 5.5e9 < a800 < 6.5e9  # paper: B >= 6 GB/s
    assert 18e9 < h800 < 20e9  # paper: B >= 19 GB/s


def test_decode_and_transfer() -> None:
    cm = cmod.preset("llama3-70b/8xA800")
    t1 = cm.decode_step_time(1, 1000)
    t64 = cm.decode_step_time(64, 64 * 12000)
    assert 0.005 < t1 < t64 < 0.2
    assert cm.decode_step_time(0, 0) == 0.0
    assert cmod.transfer_time(1e9, 1e9, 0.001) == pytest.approx(1.001)
    assert cmod.transfer_time(0, 1e9, 0.001) == 0.0
    with pytest.raises(ValueError):
        cmod.transfer_time(1, 0)


def test_fit_recovers_coefficients_and_roundtrips(tmp_path: Path) -> None:
    true_p = cmod.PrefillCoefficients(0.01, 2e-4, 3e-8)
    samples = [(L, P, true_p.time(L, P)) for L in (128, 512, 2048) for P in (0, 64, 100)]
    fitted, err = cmod.fit_prefill(samples)
    assert err < 1e-9
    assert fitted.c1 == pytest.approx(2e-4) and fitted.c2 == pytest.approx(3e-8)
    true_d = cmod.DecodeCoefficients(0.02, 1e-3, 1e-7)
    dec, derr = cmod.fit_decode([(b, c, true_d.time(b, c)) for b in (1, 4, 8) for c in (100, 5000)])
    cm = cmod.preset("smollm2-135m/cpu").with_coefficients(
        fitted, dec, {"prefill": err, "decode": derr}
    )
    path = tmp_path / "cal.json"
    cmod.save_calibration(cm, path)
    assert cmod.load_calibration(path) == cm
    with pytest.raises(ValueError):
        cmod.fit_prefill([(10, 0, 1.0)])


def test_bad_calibration_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        cmod.load_calibration(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="malformed"):
        cmod.load_calibration(bad)
    cm = cmod.preset()
    cmod.save_calibration(cm, bad)
    bad.write_text(bad.read_text().replace('"c1": ', '"c1": NaN, "x": '))
    with pytest.raises(ConfigError):
        cmod.load_calibration(bad)
    with pytest.raises(ConfigError, match="unknown cost-model preset"):
        cmod.preset("gpt-5")
    assert math.isfinite(cm.prefill.c1)


def test_the_online_mode_of_the_one_fitter() -> None:
    # decode steps whose context grows in proportion to the batch cannot pin three terms
    feats, t = cmod.decode_features([(b, 10 * b, 0.01 + 0.002 * b) for b in (1, 2, 4, 8)])
    assert cmod.fit_least_squares(feats, t, relative=True) == ()
    # times falling with the prompt: plain least squares fits a negative term, the online
    # (relative) mode drops it and refits the rest
    samples = [(L, 0, 1.0 - 1e-4 * L) for L in (100, 300, 500, 700, 900)]
    feats, t = cmod.prefill_features(samples)
    assert min(cmod.fit_least_squares(feats, t)) < 0
    coef = cmod.fit_least_squares(feats, t, relative=True)
    assert len(coef) == 3 and min(coef) >= 0 and coef[0] > 0
