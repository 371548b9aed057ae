"""Integrity of the SSD tier: the file format carries the object's checksums; files written
before checksums existed are discarded; offload and promotion verify their source against the
master's checksums and never produce a "valid" copy of corrupt bytes. A real master, a
store-server with an SSD directory and a client in this process (real sockets and files)."""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from kvcake.core.ids import ObjectKey
from kvcake.core.integrity import CHUNK, checksums
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig, MasterConfig, StoreServerConfig
from kvcake.store.disk import HEAD, MAGIC, DiskTier
from kvcake.store.errors import ChecksumMismatch, IntegrityError, ObjectNotFound
from kvcake.store.master_server import Master
from kvcake.store.metadata import Tier
from kvcake.store.server import StoreServer
from tests.waits import wait_until


def value(key: str, size: int) -> bytes:
    return random.Random(f"disk/{key}").randbytes(size)


def legacy_file(tier: DiskTier, key: str, data: bytes) -> Path:
    """A version-1 object file (CRC32, no per-key checksums), as nodes wrote before."""
    kb = key.encode()
    head = HEAD.pack(MAGIC, 1, len(kb), len(data), zlib.crc32(data) & 0xFFFFFFFF)
    path = tier.path(key)
    path.write_bytes(head + kb + data)
    return path


def test_file_format_carries_the_objects_checksums(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path)
    data = value("k", CHUNK + 10)
    sums = checksums("k", data)
    tier.write("k", memoryview(data), sums)
    out = bytearray(len(data))
    assert tier.read_into("k", memoryview(out), sums) == len(data) and out == data
    with pytest.raises(ChecksumMismatch, match="not the object's"):  # another version's sums
        tier.read_into("k", memoryview(out), checksums("k", b"x" * len(data)))
    assert not tier.path("k").exists()  # refused copies are deleted
    with pytest.raises(ChecksumMismatch, match="source"):  # a corrupt source is never stored
        tier.write("k2", memoryview(data), checksums("k2", b"y" * len(data)))
    assert not tier.path("k2").exists()


def test_legacy_files_are_discarded_and_refused(tmp_path: Path, caplog: object) -> None:
    tier = DiskTier(tmp_path)
    tier.write("new", memoryview(b"n" * 100), checksums("new", b"n" * 100))
    old = legacy_file(tier, "old", b"o" * 100)
    with pytest.raises(ChecksumMismatch, match="before checksums"):
        tier.read_into("old", memoryview(bytearray(100)))
    legacy_file(tier, "old", b"o" * 100)
    fresh = DiskTier(tmp_path)
    assert fresh.scan() == [("new", 100, checksums("new", b"n" * 100))]
    assert not old.exists()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Master, StoreServer, Client]]:
    m = Master(MasterConfig(port=0, http_port=-1, promote_after_hits=100))
    m.start()
    cfg = StoreServerConfig(master=m.rpc_address, segment_size=8 << 20, http_port=-1,
                            ssd_dir=tmp_path / "ssd")  # fmt: skip
    n = StoreServer(cfg)
    n.start()
    c = Client(ClientConfig(master=m.rpc_address))
    yield m, n, c
    c.close()
    n.stop()
    m.stop()


def failures(path: str) -> float:
    got = REGISTRY.get_sample_value("kvcake_store_integrity_failures_total", {"path": path})
    return got or 0.0


def _offload(m: Master, key: str) -> None:
    with m.state.lock:
        assert m.state.parts.tiering.start_offload(m.state.objects[ObjectKey(key)])
    wait_until(lambda: not _copying(m, key), every_s=0.02, what="the copy finished")


def _copying(m: Master, key: str) -> bool:
    obj = m.state.objects.get(ObjectKey(key))
    return obj is not None and obj.copying


def _tiers(m: Master, key: str) -> list[str]:
    obj = m.state.objects.get(ObjectKey(key))
    return sorted(r.tier.value for r in obj.replicas if r.complete) if obj else []


def test_offload_of_a_corrupt_memory_copy_makes_no_disk_copy(node: tuple) -> None:
    m, n, c = node
    key = "off/bad"
    c.put(key, value(key, 2 * CHUNK))
    rep = c.get_replica_desc(key).replicas[0]
    n.client.segments[n.segment_name][rep.offset + CHUNK + 3] ^= 0x10  # a bit flip in DRAM
    before = failures("offload")
    _offload(m, key)
    assert failures("offload") == before + 1
    assert not n.disk.path(key).exists()  # nothing "valid" was written
    assert _tiers(m, key) == []  # the corrupt memory copy was its only replica: gone
    with pytest.raises(ObjectNotFound):
        c.get(key)
    m.state.check()


def test_a_flipped_byte_in_a_disk_file_is_refused_on_read_and_promotion(node: tuple) -> None:
    m, n, c = node
    for key in ("disk/read", "disk/promote"):
        c.put(key, value(key, CHUNK + 5000))
        _offload(m, key)
        wait_until(lambda key=key: _tiers(m, key) == ["disk"], every_s=0.02,
                   what=f"{key} on disk only")  # offloaded for space: memory freed  # fmt: skip
        assert c.get(key) == value(key, CHUNK + 5000)  # a clean disk copy verifies
        path = n.disk.path(key)
        raw = bytearray(path.read_bytes())
        raw[-100] ^= 0x01
        path.write_bytes(bytes(raw))
    before = failures("disk")
    with pytest.raises(IntegrityError):
        c.get("disk/read")
    assert failures("disk") == before + 1
    assert _tiers(m, "disk/read") == []  # the bad disk replica (the last one) dropped
    with m.state.lock:  # promotion of the corrupt file: the node refuses and reports it
        m.state.parts.tiering.start_promotion(m.state.objects[ObjectKey("disk/promote")])
    wait_until(lambda: ObjectKey("disk/promote") not in m.state.objects, every_s=0.02,
               what="disk/promote removed")  # fmt: skip
    assert not n.disk.path("disk/promote").exists()
    with pytest.raises(ObjectNotFound):
        c.get("disk/promote")
    m.state.check()


def test_a_restarted_node_adopts_only_files_with_the_objects_checksums(
    tmp_path: Path, node: tuple
) -> None:
    m, n, c = node
    c.put("keep", value("keep", 4096))
    _offload(m, "keep")
    wait_until(lambda: Tier.DISK.value in _tiers(m, "keep"), every_s=0.02, what="keep on disk")
    legacy_file(n.disk, "legacy", b"l" * 4096)  # as if written by an older node
    sums = struct.unpack("<Q", n.disk.path("keep").read_bytes()[HEAD.size + 4 : HEAD.size + 12])
    assert list(sums) == checksums("keep", value("keep", 4096))  # the writer's, carried
    again = DiskTier(n.disk.root)
    assert [k for k, _, _ in again.scan()] == ["keep"]
