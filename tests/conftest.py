"""Fixtures shared across packages. The expensive ones are session-scoped and defined here,
once, so every folder that asks for them (tests/proxy, tests/launch, tests/observability, ...)
shares one instance per pytest session."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvcake.launch.launcher import Cluster

PEER = Path(__file__).resolve().parents[1] / "benchmarks" / "mooncake_peer.py"


@pytest.fixture
def socket_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Two connected sockets (``socket.socketpair``), closed afterwards."""
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


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


@pytest.fixture(scope="session")
def emulated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """1 prefill + 2 decode instances on the emulated backend, a store master + one node."""
    # Imported here, not at the top: a conftest at the root that fails to import stops the
    # collection of every folder, not only of the tests that start a cluster.
    from tests.cluster import make_cluster

    c = make_cluster(
        tmp_path_factory.mktemp("emu"),
        cluster={"prefill": 1, "decode": 2, "store_servers": 1, "store_size": "64MB"},
    )
    with c:
        yield c


@pytest.fixture(scope="session")
def pool() -> Iterator[tuple[str, str]]:
    """A store master (with its directory) and one 32 MB storage node: (directory, master rpc)."""
    from tests.store.procs import Proc, spawn

    master = spawn(
        "master", "--port", "0", "--http-port", "0", "--directory-port", "0", ready="master"
    )
    procs: list[Proc] = [master]
    try:
        store = spawn(
            "store-server", "--master", master.info["rpc"], "--segment-size", "32MB",
            "--name", "s0", ready="store-server",
        )  # fmt: skip
        procs.append(store)
        yield master.info["directory"], master.info["rpc"]
    finally:
        for p in reversed(procs):
            p.stop()
