"""Fixtures shared across packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

PEER = Path(__file__).resolve().parents[1] / "benchmarks" / "mooncake_peer.py"


@pytest.fixture
def mooncake_peer() -> tuple[ModuleType, str]:
    """``benchmarks/mooncake_peer.py`` and the Python ($KVCAKE_MOONCAKE_PYTHON) that runs it;
    the test is skipped, with the reason, when that Python cannot import mooncake."""
    spec = importlib.util.spec_from_file_location("kvcake_mooncake_peer", PEER)
    assert spec is not None and spec.loader is not None
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    python, why = peer.probe(None)
    if python is None:
        pytest.skip(f"Mooncake peer unavailable: {why}")
    return peer, python
