"""Mooncake's own Python suites, unedited, through the switch and side by side with the wheel
(``benchmarks/mooncake_suites/conformance.py``): every test the wheel passes must pass on
kvcake. Opt-in, like the wheel peer: ``KVCAKE_MOONCAKE_SRC`` names a Mooncake checkout (the
suites are not in this repository) and ``KVCAKE_MOONCAKE_PYTHON`` the wheel's venv;
``KVCAKE_MOONCAKE_SUITES`` (comma-separated file names) overrides the list below."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[2] / "benchmarks" / "mooncake_suites" / "conformance.py"
# The suites of docs/compat/mooncake.md's conformance table (CPU-only, one master each).
SUITES = (
    "test_distributed_object_store.py", "test_put_get_tensor.py",
    "test_replicated_distributed_object_store.py", "test_upsert_api.py",
    "test_batch_replica_clear.py", "test_store_setup_lifecycle.py", "test_async_store.py",
    "test_copy_move_api.py", "test_safetensor_functions.py",
)  # fmt: skip


@pytest.mark.peer
def test_every_test_the_wheel_passes_passes_on_kvcake(tmp_path: Path) -> None:
    src, wheel = os.environ.get("KVCAKE_MOONCAKE_SRC"), os.environ.get("KVCAKE_MOONCAKE_PYTHON")
    if not src or not wheel:
        pytest.skip(
            "opt-in: set KVCAKE_MOONCAKE_SRC (a Mooncake checkout) and KVCAKE_MOONCAKE_PYTHON"
        )
    wanted = os.environ.get("KVCAKE_MOONCAKE_SUITES", ",".join(SUITES)).split(",")
    where = [Path(src), Path(src) / "mooncake-wheel" / "tests", Path(src) / "scripts"]
    present = [s for s in wanted if any((d / s).is_file() for d in where)]
    if not present:
        pytest.skip(f"none of the suites is under {src}")
    run = subprocess.run(
        [sys.executable, str(RUNNER), "--mooncake-src", src, "--wheel-python", wheel,
         "--out", str(tmp_path), *present],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert all(f"| {s} |" in run.stdout for s in present), run.stdout


def test_master_args_and_env_expand_per_side(tmp_path: Path) -> None:
    """``--master-arg`` / ``--env`` values name each side's own directory (pure logic)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mc_conformance", RUNNER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.per_side(
        ["--root_fs_dir={out}/fs-{side}", "--promotion_on_hit=true"], "wheel", tmp_path
    )
    assert got == [f"--root_fs_dir={tmp_path}/fs-wheel", "--promotion_on_hit=true"]
    assert mod.per_side(["P={out}/fs-{side}"], "kvcake", tmp_path) == [f"P={tmp_path}/fs-kvcake"]
