"""Fixtures of the compat tests: the store's process fixtures, and a Mooncake store set up
against a real kvcake master (the structured-object and DataProto tests' real-store cases)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.store.conftest import Factory, master_proc, pool, procs

__all__ = ["master_proc", "pool", "procs", "real_store"]


@pytest.fixture
def real_store(procs: Factory) -> Iterator[Any]:
    """A ``MooncakeDistributedStore`` set up (32 MiB segment, tcp) against a fresh master."""
    from kvcake.compat.mooncake.store import MooncakeDistributedStore

    master = procs("master", "--port", "0", "--http-port", "0", "--client-ttl-s", "1")
    s = MooncakeDistributedStore()
    assert (
        s.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 8 << 20, "tcp", "", master.info["rpc"]) == 0
    )
    try:
        yield s
    finally:
        s.close()
