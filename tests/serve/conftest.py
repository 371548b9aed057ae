"""Fixtures: real local clusters (separate processes on 127.0.0.1, free ports), always stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvcake.launch.launcher import Cluster
from tests.serve.helpers import make_cluster
from tests.store.procs import Proc, spawn


@pytest.fixture(scope="session")
def emulated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """1 prefill + 2 decode instances on the emulated backend, a store master + one node."""
    c = make_cluster(
        tmp_path_factory.mktemp("emu"),
        cluster={"prefill": 1, "decode": 2, "store_servers": 1, "store_size": "64MB"},
    )
    with c:
        yield c


@pytest.fixture(scope="session")
def pool() -> Iterator[tuple[str, str]]:
    """A store master (with its directory) and one 32 MB storage node: (directory, master rpc)."""
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
