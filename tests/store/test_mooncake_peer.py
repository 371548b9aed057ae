"""Smoke run of benchmarks/mooncake_peer.py (the real Mooncake store: master + store-server +
client) under the Python in $KVCAKE_MOONCAKE_PYTHON; skipped with the reason when that Python
cannot import mooncake."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.peer

PEER = Path(__file__).resolve().parents[2] / "benchmarks" / "mooncake_peer.py"


def peer_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvcake_mooncake_peer", PEER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(60)
def test_store_peer_tiny() -> None:
    peer = peer_module()
    python, why = peer.probe(None)
    if python is None:
        pytest.skip(f"Mooncake peer unavailable: {why}")
    data = peer.run_peer(
        python, "store", ["--sizes", "4KB", "--repeats", "1", "--segment", "64MiB"]
    )
    assert [(r["size"], r["batch"]) for r in data["rows"]] == [("4KB", 1), ("4KB", 16)]
    for r in data["rows"]:
        assert r["put"]["ops_per_s"] > 0 and r["get"]["ops_per_s"] > 0
