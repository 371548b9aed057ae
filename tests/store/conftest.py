from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.store.procs import Proc, spawn


@pytest.fixture
def procs() -> Iterator[Callable[..., Proc]]:
    """Factory for kvcake subprocesses; every one is stopped (SIGTERM, then SIGKILL) at the end."""
    started: list[Proc] = []

    def start(command: str, *flags: str) -> Proc:
        ready = "master" if command == "master" else "store-server"
        p = spawn(command, *flags, ready=ready)
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop()


@pytest.fixture
def master_proc(procs: Callable[..., Proc]) -> Proc:
    return procs("master", "--port", "0", "--http-port", "0", "--client-ttl-s", "1")
