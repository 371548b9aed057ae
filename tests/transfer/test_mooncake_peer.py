"""Smoke run of benchmarks/mooncake_peer.py (the real Mooncake TE over TCP) under the Python in
$KVCAKE_MOONCAKE_PYTHON; skipped with the reason when that Python cannot import mooncake."""

from __future__ import annotations

import itertools
from types import ModuleType

import pytest

pytestmark = pytest.mark.peer


@pytest.mark.timeout(60)
def test_transfer_peer_tiny(mooncake_peer: tuple[ModuleType, str]) -> None:
    peer, python = mooncake_peer
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


@pytest.mark.timeout(60)
def test_stream_peer_tiny(mooncake_peer: tuple[ModuleType, str]) -> None:
    peer, python = mooncake_peer
    opts = ["--layers", "3", "--blocks", "2", "--block-bytes", "4K", "--repeats", "1"]
    data = peer.run_peer(python, "stream", [*opts, "--repeat-s", "0.05"])
    assert {r["mode"] for r in data["stream"]} == {"sync", "async"}
    assert all(r["ms_med"] > 0 and r["layers"] == 3 for r in data["stream"])
    # The layout is the benchmark's: a layer's blocks never touch (nothing coalesces).
    lay = peer.stream_layout(3, 2, 4096)
    assert all(abs(a[1] - b[1]) > 4096 for layer in lay for a, b in itertools.pairwise(layer))
