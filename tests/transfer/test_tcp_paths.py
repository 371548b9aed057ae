"""TCP transport: slicing, multi-path spreading, the topology matrix, the endpoint cap."""

from __future__ import annotations

import collections
import zlib

from kvcake.core.ids import SegmentName
from kvcake.transfer import Op, TransferConfig, TransferRequest
from tests.waits import wait_until

from .conftest import EngineFactory, pattern

S = SegmentName
NICS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def cfg(**kw: object) -> TransferConfig:
    base = {"slice_size": 65536, "lane_bytes": 65536, "io_timeout_s": 5.0, "probe_interval_s": 0.05}
    base.update(kw)
    return TransferConfig(**base)  # type: ignore[arg-type]


def count_sends(engine) -> collections.Counter[str]:  # type: ignore[no-untyped-def]
    sent: collections.Counter[str] = collections.Counter()
    engine.hooks.after_send = lambda addr, _n: sent.update([addr])
    return sent


def test_large_request_is_sliced_over_paths(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp", config=cfg(streams=3))
    b = make_engine(listen_hosts=NICS)
    assert len(b.addresses) == 3
    src = pattern(1 << 20, seed=2)
    a.register_memory("a", src)
    dst = bytearray(1 << 20)
    b.register_memory("b", dst)
    sent = count_sends(a)
    a.transfer_sync_write("b", "a", 0, 0, 1 << 20)
    assert sum(sent.values()) == 16  # 1 MiB / 64 KiB slices
    assert set(sent) == set(b.addresses)  # three lanes, one per "NIC"
    assert zlib.crc32(dst) == zlib.crc32(src)
    sent.clear()
    src[:] = bytes(len(src))
    a.transfer_sync_read("b", "a", 0, 0, 1 << 20)
    assert sum(sent.values()) == 16 and len(sent) == 3
    assert src == dst


def test_small_batch_coalesces_into_one_slice(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp", config=cfg())
    b = make_engine()
    a.register_memory("a", pattern(16 * 1024, seed=3))
    dst = b.allocate_segment("b", 16 * 1024)
    sent = count_sends(a)
    reqs = [TransferRequest(Op.WRITE, S("a"), i * 1024, S("b"), i * 1024, 1024) for i in range(16)]
    res = a.transfer(reqs)
    assert res.ok and len(res.results) == 16
    assert sum(sent.values()) == 1  # 16 contiguous requests -> one 16 KiB slice
    assert bytes(dst) == bytes(a._segments.get("a").view)


def test_topology_preferred_then_secondary(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp", config=cfg(streams=4))
    topo = {"cpu:0": (["127.0.0.2"], ["127.0.0.3"])}
    b = make_engine(listen_hosts=NICS, topology=topo)
    info = b.register_memory("b", bytearray(1 << 20), location="cpu:0")
    by_host = {p.address.split(":")[0]: p.tier for p in info.paths}
    assert by_host == {"127.0.0.2": 0, "127.0.0.3": 1}
    a.register_memory("a", pattern(1 << 20, seed=4))
    sent = count_sends(a)
    a.transfer_sync_write("b", "a", 0, 0, 1 << 20)
    assert {addr.split(":")[0] for addr in sent} == {"127.0.0.2"}
    preferred = next(p.address for p in info.paths if p.tier == 0)
    b.server.close_address(preferred)  # the preferred NIC dies
    sent.clear()
    a.transfer_sync_write("b", "a", 0, 0, 1 << 20)
    assert {addr.split(":")[0] for addr in sent} <= {"127.0.0.2", "127.0.0.3"}
    assert sent[next(p.address for p in info.paths if p.tier == 1)] > 0
    assert preferred in a.health.down()


def test_endpoint_cap_and_sieve_eviction(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp", config=cfg(streams=4, max_endpoints=2))
    b = make_engine(listen_hosts=NICS)
    a.register_memory("a", pattern(1 << 20, seed=5))
    dst = bytearray(1 << 20)
    b.register_memory("b", dst)
    peak = []

    def watch(_addr: str, _n: int) -> None:
        a.pool.check()
        peak.append(a.pool.stats()["open"])

    a.hooks.after_send = watch
    for _ in range(3):
        a.transfer_sync_write("b", "a", 0, 0, 1 << 20)
    # A lane may still be handing its endpoint back when the batch is complete.
    wait_until(lambda: not a.pool.stats()["busy"], timeout=5, every_s=0.005,
               what="every endpoint handed back")  # fmt: skip
    stats = a.pool.stats()
    assert max(peak) <= 2 and stats["open"] <= 2
    assert stats["evicted"] >= 1  # three NICs through two endpoints: someone was evicted
    assert stats["busy"] == 0
    a.pool.check()
    assert bytes(dst) == bytes(a._segments.get("a").view)
