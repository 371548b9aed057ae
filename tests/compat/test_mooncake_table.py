"""The call table (tests/compat/mooncake_table.py) against kvcake's shim and, where the wheel is
installed, against the real Mooncake 0.3.13.post1 side by side.

``mooncake_expected.json`` holds the wheel's results, recorded on this machine kind by
``test_wheel_matches_table`` (re-record: ``KVCAKE_RECORD=1``). kvcake must give the same result
for every case except those in ``KVCAKE_DIFFERS``, each with the value kvcake gives and why.
The wheel runs in its own venv through a subprocess (the two ``mooncake`` packages never meet):
``KVCAKE_MOONCAKE_PYTHON=/path/to/venv/bin/python`` (opt-in: the wheel's Transfer Engine listens
on every interface); without it the wheel cases are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcake.compat.mooncake import shim
from tests.store.procs import Proc

HERE = Path(__file__).parent
TABLE = HERE / "mooncake_table.py"
EXPECTED = json.loads((HERE / "mooncake_expected.json").read_text())
CRASH = "SEGFAULT-IN-WHEEL"

# case -> (kvcake's result, why it differs from the wheel's)
KVCAKE_DIFFERS: dict[str, tuple[object, str]] = {
    "pre.put": (-1, "the wheel segfaults on calls before setup; kvcake returns -1"),
    "pre.is_exist": (-1, "the wheel segfaults before setup; kvcake: -1 (is_exist's error)"),
    "pre.get_size": (-1, "the wheel segfaults before setup"),
    "pre.remove": (-1, "the wheel segfaults before setup"),
    "pre.hostname": ("", "the wheel segfaults before setup; kvcake: empty name"),
    "setup.bad_metadata": (-600, "the wheel aborts the process on an unknown metadata scheme"),
    "upsert.leased": (
        -706,
        "kvcake's master refuses to overwrite an object a reader holds a lease on "
        "(docs/store.md); the wheel overwrites it",
    ),
}


def wheel_python() -> str | None:
    """Opt-in (the wheel's engine listens on every interface, so it never runs by default)."""
    py = os.environ.get("KVCAKE_MOONCAKE_PYTHON", "")
    return py if py and Path(py).is_file() else None


def run_table(python: str, master: str, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [python, str(TABLE), master],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **env},
        check=False,
    )
    assert out.returncode == 0, f"table run failed ({out.returncode}):\n{out.stderr[-3000:]}"
    return dict(json.loads(out.stdout))


@pytest.fixture(scope="module")
def shim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shim.install(tmp_path_factory.mktemp("shim")).parent


def test_shim_matches_table(master_proc: Proc, shim_dir: Path) -> None:
    got = run_table(sys.executable, master_proc.info["rpc"], {"PYTHONPATH": str(shim_dir)})
    assert got.pop("__module__") == "kvcake"
    assert set(got) == set(EXPECTED), "the table and the recorded results differ in cases"
    wrong = {}
    for case, want in EXPECTED.items():
        want = KVCAKE_DIFFERS[case][0] if case in KVCAKE_DIFFERS else want
        if got[case] != want:
            wrong[case] = (got[case], want)
    assert not wrong, json.dumps(wrong, indent=1)


@pytest.mark.peer
def test_wheel_matches_table(tmp_path: Path) -> None:
    py = wheel_python()
    if py is None:
        pytest.skip("the Mooncake wheel venv is not installed (set KVCAKE_MOONCAKE_PYTHON)")
    from tests.compat.wheel import mooncake_master

    # Without safetensors the wheel answers -600 to every save (its C++ imports the module),
    # and without torch every tensor row fails: say so instead of a page of differences.
    probe = subprocess.run(
        [py, "-c", "import torch, safetensors"], capture_output=True, timeout=120
    )
    assert probe.returncode == 0, "the wheel's venv needs torch and safetensors: " + str(
        probe.stderr[-500:]
    )
    with mooncake_master(Path(py).parent) as master:
        got = run_table(py, master, {})
    assert got.pop("__module__") == "mooncake"
    if os.environ.get("KVCAKE_RECORD"):
        (HERE / "mooncake_expected.json").write_text(
            json.dumps(got, indent=1, sort_keys=True) + "\n"
        )
    diff = {k: (got.get(k), v) for k, v in EXPECTED.items() if got.get(k) != v}
    assert not diff, json.dumps(diff, indent=1)


def test_differences_are_real() -> None:
    """Every listed difference is a case where the wheel's recorded result is another value."""
    for case, (ours, _why) in KVCAKE_DIFFERS.items():
        assert case in EXPECTED and EXPECTED[case] != ours


ENGINE_TABLE = HERE / "engine_table.py"
ENGINE_EXPECTED = json.loads((HERE / "engine_expected.json").read_text())


def run_engine_table(python: str, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [python, str(ENGINE_TABLE)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=False,
    )
    assert out.returncode == 0, f"engine table failed ({out.returncode}):\n{out.stderr[-3000:]}"
    return dict(json.loads(out.stdout))


def test_engine_shim_matches_table(shim_dir: Path) -> None:
    got = run_engine_table(sys.executable, {"PYTHONPATH": str(shim_dir)})
    assert got.pop("__module__") == "kvcake"
    diff = {k: (got.get(k), v) for k, v in ENGINE_EXPECTED.items() if got.get(k) != v}
    assert not diff and set(got) == set(ENGINE_EXPECTED), json.dumps(diff, indent=1)


@pytest.mark.peer
def test_engine_wheel_matches_table() -> None:
    py = wheel_python()
    if py is None:
        pytest.skip("the Mooncake wheel venv is not installed (set KVCAKE_MOONCAKE_PYTHON)")
    got = run_engine_table(py, {})
    assert got.pop("__module__") == "mooncake"
    diff = {k: (got.get(k), v) for k, v in ENGINE_EXPECTED.items() if got.get(k) != v}
    assert not diff, json.dumps(diff, indent=1)
