from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.store.procs import Proc, spawn

Factory = Callable[..., Proc]


def _factory() -> tuple[Factory, list[Proc]]:
    started: list[Proc] = []

    def start(command: str, *flags: str) -> Proc:
        p = spawn(command, *flags, ready="master" if command == "master" else "store-server")
        started.append(p)
        return p

    return start, started


@pytest.fixture
def procs() -> Iterator[Factory]:
    """Factory for kvcake subprocesses; every one is stopped (SIGTERM, then SIGKILL) at the end."""
    start, started = _factory()
    yield start
    for p in reversed(started):
        p.stop()


@pytest.fixture
def master_proc(procs: Factory) -> Proc:
    return procs("master", "--port", "0", "--http-port", "0", "--client-ttl-s", "1")


@pytest.fixture(scope="module")
def pool() -> Iterator[tuple[Proc, Proc]]:
    """A master and one 64 MB store-server shared by a module's tests."""
    start, started = _factory()
    try:  # a node that fails to start must not leave the master running
        master = start("master", "--port", "0", "--http-port", "0", "--client-ttl-s", "1")
        node = start("store-server", "--master", master.info["rpc"], "--segment-size", "64MiB")
        yield master, node
    finally:
        for p in reversed(started):
            p.stop()
