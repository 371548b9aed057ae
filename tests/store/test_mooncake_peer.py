"""Smoke run of benchmarks/mooncake_peer.py (the real Mooncake store: master + store-server +
client) under the Python in $KVCAKE_MOONCAKE_PYTHON; skipped with the reason when that Python
cannot import mooncake."""

from __future__ import annotations

from types import ModuleType

import pytest

pytestmark = pytest.mark.peer


@pytest.mark.timeout(60)
def test_store_peer_tiny(mooncake_peer: tuple[ModuleType, str]) -> None:
    peer, python = mooncake_peer
    data = peer.run_peer(
        python, "store", ["--sizes", "4KB", "--repeats", "1", "--segment", "64MiB"]
    )
    assert [(r["size"], r["batch"]) for r in data["rows"]] == [("4KB", 1), ("4KB", 16)]
    for r in data["rows"]:
        assert r["put"]["ops_per_s"] > 0 and r["get"]["ops_per_s"] > 0
