"""The shared file tier end to end (master.root_fs_dir): a real master, a store-server and
clients in this process. Every put is written through to a verified file under
``root/<cluster>/``; with every memory copy evicted a get returns the exact bytes from the file;
remove deletes the file; a missing or corrupt file is a typed error, never wrong bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcake.core.errors import ConfigError
from kvcake.core.ids import ClientId
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig, MasterConfig, StoreServerConfig
from kvcake.store.disk import HEAD
from kvcake.store.errors import IntegrityError, InvalidParams, ObjectNotFound, TransferFailed
from kvcake.store.filetier import FILE_SEGMENT
from kvcake.store.master_server import Master
from kvcake.store.server import StoreServer
from tests.waits import wait_until

KB = 1024
SEGMENT = 1 << 20


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Master, StoreServer]]:
    cfg = MasterConfig(port=0, http_port=-1, root_fs_dir=tmp_path, root_fs_quota=64 << 20)
    m = Master(cfg, cluster="poolA")
    m.start()
    node = StoreServer(StoreServerConfig(master=m.rpc_address, segment_size=SEGMENT, http_port=-1))
    node.start()
    yield m, node
    node.stop()
    m.stop()


def value(i: int, size: int = 64 * KB) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(256)) * (size // 256)


def files(m: Master) -> list[Path]:
    root = Path(m.state.segments[FILE_SEGMENT].endpoint)
    return sorted(p for p in root.rglob("*.obj"))


def file_only(c: Client, key: str, segment: str) -> P.ReplicaDesc:
    """Drop ``key``'s memory copy (another readable one, its file, remains): forced eviction."""
    c.drop_replica(key, segment)
    reps = c.get_replica_desc(key).replicas
    assert [r.tier for r in reps] == ["file"]
    return reps[0]


def test_puts_write_files_and_evicted_objects_read_back_exactly(
    live: tuple[Master, StoreServer], tmp_path: Path
) -> None:
    m, node = live
    with Client(ClientConfig(master=m.rpc_address)) as c:
        keys = [f"k/{i}" for i in range(40)]  # 2.5x the memory segment
        for i, k in enumerate(keys):
            c.put(k, value(i))
        assert c.writes.writer is not None and c.writes.writer.flush()
        assert all(p.is_relative_to(tmp_path / "poolA") for p in files(m))
        wait_until(lambda: any(not o.memory() for o in m.state.objects.values()), every_s=0.02,
                   what="an object offloaded from memory")  # fmt: skip
        for i, k in enumerate(keys):  # memory held ~16 of them: the rest come from files
            assert bytes(c.get(k)) == value(i), k
        assert c.file_reads > 0
        from prometheus_client import generate_latest

        text = generate_latest(m.metrics.registry).decode()
        assert 'kvcake_store_segment_capacity_bytes{segment="@files",tier="file"}' in text
        assert "kvcake_store_file_failed 0.0" in text
        last = keys[-1]  # still in memory (most recent): drop that copy, read the file
        if any(r.tier == "memory" for r in c.get_replica_desc(last).replicas):
            file_only(c, last, node.segment_name)
        assert bytes(c.get(last)) == value(len(keys) - 1)
        out = bytearray(64 * KB)
        assert c.get_into(keys[0], out) == 64 * KB and bytes(out) == value(0)
        m.state.check()


def test_remove_deletes_the_file(live: tuple[Master, StoreServer]) -> None:
    m, _ = live
    with Client(ClientConfig(master=m.rpc_address)) as c:
        c.put("gone", value(1))
        c.put("kept", value(2))
        assert c.writes.writer is not None and c.writes.writer.flush()
        assert len(files(m)) == 2
        c.remove("gone")
        wait_until(lambda: len(files(m)) == 1, every_s=0.02, what="one file in the tier")
        assert bytes(c.get("kept")) == value(2)
        assert c.remove_all(force=True) == 1
        wait_until(lambda: not files(m), every_s=0.02, what="no file left in the tier")
        wait_until(lambda: m.state.segments[FILE_SEGMENT].allocator.allocated == 0, every_s=0.02,
                   what="the file segment empty")  # fmt: skip
        m.state.check()


def test_missing_or_corrupt_file_is_a_typed_error(live: tuple[Master, StoreServer]) -> None:
    m, node = live
    with Client(ClientConfig(master=m.rpc_address)) as c:
        for k in ("missing", "flipped", "truncated", "swapped"):
            c.put(k, value(3))
        c.put("other", value(4))
        assert c.writes.writer is not None and c.writes.writer.flush()
        paths = {k: Path(file_only(c, k, node.segment_name).endpoint) for k in
                 ("missing", "flipped", "truncated", "swapped")}  # fmt: skip
        paths["missing"].unlink()
        raw = bytearray(paths["flipped"].read_bytes())
        raw[HEAD.size + 100] ^= 0xFF
        paths["flipped"].write_bytes(bytes(raw))
        paths["truncated"].write_bytes(paths["truncated"].read_bytes()[:1000])
        other = Path(next(r.endpoint for r in c.get_replica_desc("other").replicas
                          if r.tier == "file"))  # fmt: skip
        os.replace(other, paths["swapped"])  # a valid file, of another key
        with pytest.raises(TransferFailed, match="missing"):
            c.get("missing")
        assert isinstance(c.batch_get(["missing"])[0], TransferFailed)
        reasons = {"flipped": "checksum", "truncated": "corrupt", "swapped": "another key"}
        for k, why in reasons.items():  # refused, and the corrupt (last) replica dropped
            with pytest.raises(IntegrityError, match=why):
                c.get(k)
            assert isinstance(c.batch_get([k])[0], ObjectNotFound)
        m.state.check()


def test_malformed_input(tmp_path: Path, live: tuple[Master, StoreServer]) -> None:
    with pytest.raises(ConfigError, match="root_fs_quota"):
        MasterConfig(root_fs_dir=tmp_path, root_fs_quota=-1)
    with pytest.raises(ConfigError, match="file_queue_bytes"):
        ClientConfig(file_queue_bytes=0)
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"x")
    with pytest.raises(ConfigError, match="root_fs_dir"):
        Master(MasterConfig(port=0, http_port=-1, root_fs_dir=blocker))
    m, _ = live
    with Client(ClientConfig(master=m.rpc_address)) as c:
        with pytest.raises(InvalidParams, match="reserved"):
            c.conn.call(P.Mount(c.id, c.host, FILE_SEGMENT, 1 << 20))
        c.put("k", value(5))
        assert c.writes.writer is not None and c.writes.writer.flush()
        for bogus in (P.TaskDone(c.id, "persist", "k", True, offset=-1),
                      P.TaskDone(c.id, "persist", "nope", True, offset=0),
                      P.TaskDone("someone-else", "persist", "k", False, offset=0)):  # fmt: skip
            assert c.conn.call(bogus).code == 0  # ignored, nothing changes
        assert bytes(c.get("k")) == value(5) and len(files(m)) == 1
        assert ClientId("@files") not in m.state.clients
        m.state.check()
