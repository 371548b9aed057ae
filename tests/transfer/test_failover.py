"""Failure handling: a path dies mid-transfer (test hook), unfinished slices move to another
path, every byte arrives (checksums), the dead path is avoided until a probe succeeds."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from kvcake.core.ids import SegmentName
from kvcake.transfer import Op, TransferRequest
from tests.waits import wait_until

from .conftest import EngineFactory, pattern
from .test_tcp_paths import NICS, cfg

S = SegmentName
SIZE = 8 << 20


def digest(b: object) -> str:
    return hashlib.sha256(memoryview(b)).hexdigest()  # type: ignore[arg-type]


def kill_after(engine, server, victim: str, n: int) -> threading.Event:  # type: ignore[no-untyped-def]
    fired = threading.Event()

    def hook(addr: str, count: int) -> None:
        if addr == victim and count == n and not fired.is_set():
            fired.set()
            server.close_address(victim)  # listener and every accepted socket on that NIC

    engine.hooks.after_send = hook
    return fired


@pytest.mark.parametrize("op", [Op.WRITE, Op.READ])
def test_path_killed_mid_transfer_is_byte_exact(make_engine: EngineFactory, op: Op) -> None:
    a = make_engine(protocol="tcp", config=cfg(streams=3, window=2))
    b = make_engine(listen_hosts=NICS)
    src = pattern(SIZE, seed=10)
    dst = bytearray(SIZE)
    if op is Op.WRITE:
        a.register_memory("a", src)
        b.register_memory("b", dst)
        want, got = src, dst
    else:
        a.register_memory("a", dst)
        b.register_memory("b", src)
        want, got = src, dst
    victim = b.addresses[1]
    fired = kill_after(a, b.server, victim, 5)
    # Many separate requests so the failure hits several of them mid-flight.
    reqs = [TransferRequest(op, S("a"), o, S("b"), o, 1 << 20) for o in range(0, SIZE, 1 << 20)]
    res = a.wait(a.submit(reqs), 30)
    assert fired.is_set()
    assert res.ok, res
    assert digest(got) == digest(want)
    assert a.health.down() == [victim]
    assert a.health.failures[victim] >= 1
    a.pool.check()


def test_broken_path_avoided_until_probe_succeeds(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp", config=cfg(streams=2, window=2, probe_interval_s=0.2))
    b = make_engine(listen_hosts=NICS[:2])
    a.register_memory("a", pattern(1 << 20, seed=11))
    dst = bytearray(1 << 20)
    b.register_memory("b", dst)
    victim, other = b.addresses
    kill_after(a, b.server, victim, 1)
    a.transfer_sync_write("b", "a", 0, 0, 1 << 20)
    # The victim may have answered that one request before its NIC went away (a race under
    # load): the next write then finds it closed.
    for _ in range(3):
        if a.health.down():
            break
        a.transfer_sync_write("b", "a", 0, 0, 1 << 20)
    assert a.health.down() == [victim]
    sent: list[str] = []
    a.hooks.after_send = lambda addr, _n: sent.append(addr)
    a.transfer_sync_write("b", "a", 0, 0, 1 << 20)  # within the probe interval: avoided
    assert set(sent) == {other}
    b.server.reopen_address(victim)
    time.sleep(0.25)
    sent.clear()
    a.transfer_sync_write("b", "a", 0, 0, 1 << 20)  # probe is due: started in the background
    wait_until(lambda: not a.health.down(), timeout=5, every_s=0.01, what="the path back up")
    assert a.health.probes[victim] >= 1
    assert a.health.down() == []
    sent.clear()
    a.transfer_sync_write("b", "a", 0, 0, 1 << 20)
    assert victim in sent
    assert bytes(dst) == bytes(a._segments.get("a").view)


def test_no_path_left_fails_only_that_target(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp", config=cfg(probe_interval_s=10.0))
    b = make_engine(listen_hosts=NICS[:2])
    c = make_engine()
    a.register_memory("a", pattern(1 << 20, seed=12))
    b.register_memory("b", bytearray(1 << 20))
    dst_c = bytearray(1 << 20)
    c.register_memory("c", dst_c)
    for addr in b.addresses:
        b.server.close_address(addr)
    reqs = [
        TransferRequest(Op.WRITE, S("a"), 0, S("b"), 0, 1 << 20),
        TransferRequest(Op.WRITE, S("a"), 0, S("c"), 0, 1 << 20),
    ]
    t0 = time.monotonic()
    res = a.wait(a.submit(reqs), 20)
    assert time.monotonic() - t0 < 10
    assert [r.error_type for r in res.results] == ["NoPathAvailable", None]
    assert bytes(dst_c) == bytes(a._segments.get("a").view)


def test_small_request_fast_path_fails_over(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp", config=cfg(probe_interval_s=10.0))
    b = make_engine(listen_hosts=NICS[:2])
    mem = pattern(65536, seed=13)
    b.register_memory("b", mem)
    out = bytearray(4096)
    a.read_into("b", 0, out)  # opens a pooled connection on the first path
    first = b.addresses[0]
    b.server.close_address(first)  # the pooled connection is now dead
    out[:] = bytes(4096)
    a.read_into("b", 4096, out)  # fast path fails, general path retries on the other NIC
    assert out == mem[4096:8192]
    assert a.health.down() == [first]
