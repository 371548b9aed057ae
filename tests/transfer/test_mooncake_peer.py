"""Smoke run of benchmarks/mooncake_peer.py (the real Mooncake TE over TCP) under the Python in
$KVCAKE_MOONCAKE_PYTHON; skipped with the reason when that Python cannot import mooncake."""

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
def test_transfer_peer_tiny() -> None:
    peer = peer_module()
    python, why = peer.probe(None)
    if python is None:
        pytest.skip(f"Mooncake peer unavailable: {why}")
    data = peer.run_peer(
        python,
        "transfer",
        [
            "--sizes",
            "64K",
            "--repeats",
            "1",
            "--min-bytes",
            "1000000",
            "--min-batches",
            "2",
            "--repeat-s",
            "0.05",
            "--latency-iters",
            "50",
        ],
    )
    assert {(r["op"], r["block"]) for r in data["rows"]} == {("write", 65536), ("read", 65536)}
    assert all(r["gbps_med"] > 0 for r in data["rows"])
    assert data["latency"]["mooncake_read_4k_p50_us"] > 0
