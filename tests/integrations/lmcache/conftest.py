"""The LMCache venv (``make install-lmcache``) and a kvcake pool for the LMCache tests.

LMCache pins numpy<=2.2.6, so it lives in its own venv layered on the project's; its code runs
in subprocesses of that venv's Python. Without the venv the tests fail and name the target."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.store.conftest import pool  # noqa: F401  (a master and a 64 MB node per module)

ROOT = Path(__file__).resolve().parents[3]
LMC_PYTHON = ROOT / ".venv-lmcache" / "bin" / "python"
STAMP = ROOT / ".venv-lmcache" / ".installed-lmcache"
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def lmc_python() -> Path:
    if not STAMP.exists():
        pytest.fail("the LMCache venv is not installed: run `make install-lmcache` "
                    "(LMCache 0.5.6 in .venv-lmcache; a required part of make test)")  # fmt: skip
    return LMC_PYTHON


def run_json(
    python: Path, script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> dict[str, object]:
    """Run ``script`` (in this directory) with the LMCache venv's Python; its last stdout line
    is JSON. The log goes to the assertion message on failure. PYTHONHASHSEED is fixed: LMCache
    hashes chunks with Python's ``hash`` here, and the processes must agree on the keys."""
    proc = subprocess.run([str(python), str(HERE / script), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONHASHSEED": "0", **(env or {})})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return dict(json.loads(lines[-1]))
