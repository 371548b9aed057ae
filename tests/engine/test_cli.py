from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcake.cli import main
from kvcake.core.costmodel import load_calibration
from kvcake.engine.calibrate import Grid, calibrate


def test_generate_answers_capital_of_france(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "generate",
            "What is the capital of France?",
            "--max-tokens",
            "12",
            "--threads",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Paris" in out


def test_generate_raw_continues_the_text(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--raw", "The capital of France is", "--max-tokens", "4"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("The capital of France is") and len(out.strip()) > 24


def test_generate_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", "/nonexistent/model"]) == 2


def test_calibrate_emulated_writes_a_loadable_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cal.json"
    assert (
        main(
            [
                "calibrate",
                "--backend",
                "emulated",
                "--time-scale",
                "0.2",
                "--repeats",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "fit error" in text
    cm = load_calibration(out)
    assert cm.source == "fitted" and set(cm.fit_error) == {"prefill", "decode"}
    assert json.loads(out.read_text())["model"]["name"] == "llama3-70b"
    # The emulator sleeps the preset's times x 0.2, so the fit recovers them.
    assert cm.prefill_time(4096, 0) == pytest.approx(
        0.2 * cm.model.prefill_flops(4096) / cm.hardware.effective_flops, rel=0.3
    )


def test_calibrate_torch_backend_small_grid(fresh: Any) -> None:
    grid = Grid(
        prefill=((32, 0), (96, 0), (160, 0), (160, 96)),
        decode=((1, 32), (2, 64), (4, 32)),
        repeats=1,
    )
    cm = calibrate(fresh, grid, vocab=fresh.model_config.vocab)
    assert cm.source == "fitted"
    assert cm.prefill_time(160, 0) > 0 and cm.decode_step_time(2, 64) > 0
    assert cm.fit_error["prefill"] < 1.0
