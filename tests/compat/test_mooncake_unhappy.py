"""Unhappy paths through the shim: the master dies under a store, a peer engine goes away
mid-session. Mooncake's convention holds: error codes, never an exception or a hang."""

from __future__ import annotations

import signal
import time

from kvcake.compat.mooncake.engine import TransferEngine
from kvcake.compat.mooncake.store import MooncakeDistributedStore
from tests.store.conftest import Factory

MB = 1024 * 1024


def test_master_dies_under_a_store(procs: Factory) -> None:
    master = procs("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "1")
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 8 * MB, 8 * MB, "tcp", "", master.info["rpc"]) == 0
    assert s.put("k", b"v") == 0
    master.stop(signal.SIGKILL)
    t0 = time.monotonic()
    assert s.health_check() == 2
    assert s.put("k2", b"v") < 0
    assert s.get("k") == b""
    assert s.is_exist("k") == -1
    assert s.get_batch(["k", "k2"]) == [b"", b""]
    assert s.batch_put_from([], [], []) == []
    assert time.monotonic() - t0 < 120  # bounded by the client's RPC timeout and retries
    assert s.close() == 0


def test_peer_engine_goes_away() -> None:
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    name = f"127.0.0.1:{b.get_rpc_port()}"
    pa, pb = a.allocate_managed_buffer(MB), b.allocate_managed_buffer(MB)
    assert a.transfer_sync_write(name, pa, pb, 4096) == 0
    b._close()  # the peer process is gone: its directory and transfer server are closed
    assert a.transfer_sync_write(name, pa, pb, 4096) == -1
    assert a.batch_transfer_sync_read(name, [pa], [pb], [16]) == -1
    assert a.batch_transfer_async_write(name, [pa], [pb + MB * 4], [16]) == 0  # unknown range
    assert a.send_probe(name) != 0
    assert a.get_batch_transfer_status([12345]) == -1  # an id never handed out
    assert a.transfer_check_status(12345) == -1
    a._close()
