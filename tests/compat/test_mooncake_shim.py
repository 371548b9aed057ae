"""MooncakeDistributedStore shim: Mooncake 0.3.13's return values and error codes, against a
real master and store-server."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvcake.compat.mooncake import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
from tests.store.procs import Proc
from tests.waits import wait_until

MB = 1024 * 1024


@pytest.fixture
def store(pool: tuple[Proc, Proc]) -> Iterator[MooncakeDistributedStore]:
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 * MB, "tcp", "", pool[0].info["rpc"])
    assert rc == 0
    yield s
    s.remove_all(force=True)
    assert s.close() == 0
    assert s.close() == 0  # idempotent


def test_calls_before_setup_return_errors() -> None:
    s = MooncakeDistributedStore()
    assert s.health_check() == 1
    assert s.put("k", b"v") < 0
    assert s.get("k") == b""
    assert s.is_exist("k") == -1
    assert s.get_batch(["a"]) == [b""]  # the wheel answers so too
    assert s.get_into("k", 1234, 10) < 0
    assert s.remove("k") < 0
    assert s.get_tensor("k") is None
    assert s.close() == 0


def test_setup_rejects_bad_config(master_proc: Proc) -> None:
    s = MooncakeDistributedStore()
    cfg = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_addr": master_proc.info["rpc"],
        "global_segment_size": "50%",
    }
    assert s.setup(cfg) == -600
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, MB, "tcp", "", "127.0.0.1:1") == -1
    cfg["global_segment_size"] = "0"
    cfg["local_buffer_size"] = "16MB"
    assert s.setup(cfg) == 0  # sizes as strings
    assert s.health_check() == 0
    assert s.put("x", b"v") == -200  # a pure client and no segment in the cluster
    s.close()


def test_put_get_conventions(store: MooncakeDistributedStore) -> None:
    assert store.put("k", b"v1") == 0
    assert store.put("k", b"v2") == 0  # never overwrites, still success
    assert store.get("k") == b"v1"
    assert store.get("missing") == b""
    assert store.put("", b"x") == -600
    assert store.put("empty", b"") == -600
    assert store.get("") == b""
    assert store.get_size("k") == 2
    assert store.get_size("missing") == -704
    assert store.is_exist("k") == 1 and store.is_exist("missing") == 0
    assert store.is_exist("") == -1
    assert store.batch_is_exist(["k", "missing"]) == [1, 0]
    assert store.put_parts("parts", b"ab", memoryview(b"cd"), bytearray(b"e")) == 0
    assert store.get("parts") == b"abcde"
    assert bytes(store.get_buffer("parts") or b"") == b"abcde"
    assert store.get_buffer("missing") is None
    cfg = ReplicateConfig()
    cfg.replica_num = 3  # best effort: one segment -> one replica, still success
    cfg.soft_pin_action = SoftPinAction.ENABLE
    assert store.put("rep", b"r", cfg) == 0
    assert len(store.get_replica_desc("rep")) == 1
    assert store.get_replica_desc("missing") == []
    assert store.upsert("k", b"new") == -706  # leased by the reads above
    assert store.upsert("u", b"old") == 0
    assert store.upsert("u", b"new") == 0
    assert store.get("u") == b"new"


def test_batches(store: MooncakeDistributedStore) -> None:
    keys = [f"b{i}" for i in range(8)]
    vals = [bytes([i]) * (i + 1) for i in range(8)]
    assert store.put_batch(keys, vals) == 0
    assert store.get_batch([*keys, "nope"]) == [*vals, b""]
    assert store.put_batch(keys, vals[:2]) == -600
    assert store.put_batch(["ok", ""], [b"1", b"2"]) == -600
    assert store.batch_get_buffer(["b0", "nope"])[1] is None


def test_remove_conventions(store: MooncakeDistributedStore) -> None:
    assert store.remove("nothing") == -704
    store.put("r", b"v")
    assert store.remove("r") == 0  # a fresh put holds no lease
    store.put("r", b"v")
    assert store.get("r") == b"v"  # lease
    assert store.remove("r") == -706
    assert store.batch_remove(["r", "nothing"]) == [-706, -704]
    assert store.remove("r", force=True) == 0
    for i in range(5):
        store.put(f"x{i}", b"v")
    store.put("y", b"v")
    assert store.remove_by_regex("^x") == 5
    assert store.remove_all() == 1


def test_pointer_calls(store: MooncakeDistributedStore) -> None:
    src = np.arange(1000, dtype=np.int32)
    dst = np.zeros(1000, dtype=np.int32)
    small = (ctypes.c_char * 16)()
    sp, dp = src.ctypes.data, dst.ctypes.data
    assert store.register_buffer(sp, src.nbytes) == 0
    assert store.register_buffer(dp, dst.nbytes) == 0
    assert store.put_from("p", sp, src.nbytes) == 0
    assert store.get_into("p", dp, dst.nbytes) == src.nbytes
    assert np.array_equal(src, dst)
    assert store.get_into("p", ctypes.addressof(small), 16) == -600  # too small
    assert store.get_into("missing", dp, dst.nbytes) == -704
    assert store.put_from("", sp, 10) == -600
    assert store.put_from("zero", sp, 0) == 0  # the wheel: success, nothing stored
    dst[:] = 0
    half = src.nbytes // 2
    assert store.batch_put_from(["p1", "p2"], [sp, sp + half], [half, half]) == [0, 0]
    assert store.batch_get_into(["p1", "p2", "pz"], [dp, dp + half, dp], [half, half, 4]) == [
        half,
        half,
        -704,
    ]
    assert np.array_equal(src, dst)
    assert store.batch_put_from(["a", "b"], [sp], [4]) == [-600, -600]
    assert store.batch_put_from_multi_buffers(["m"], [[sp, sp + half]], [[8, 8]]) == [0]
    out1, out2 = np.zeros(2, np.int32), np.zeros(2, np.int32)
    got = store.batch_get_into_multi_buffers(
        ["m"], [[out1.ctypes.data, out2.ctypes.data]], [[8, 8]]
    )
    assert got == [16]
    assert list(out1) == [0, 1] and list(out2) == list(src[half // 4 : half // 4 + 2])
    assert store.unregister_buffer(sp) == 0
    assert store.unregister_buffer(sp) == -600


def test_tensors_and_local_buffer(store: MooncakeDistributedStore, pool: tuple[Proc, Proc]) -> None:
    import torch

    t = torch.randn(3, 5).to(torch.bfloat16)
    assert store.put_tensor("t", t) == 0
    back = store.get_tensor("t")
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)
    assert store.get_tensor("missing") is None
    assert store.batch_put_tensor(["t1", "t2"], [t, t * 2]) == [0, 0]
    assert torch.equal(store.batch_get_tensor(["t1", "t2"])[1], t * 2)
    node = MooncakeDistributedStore()  # a pure storage node (no local buffer): its puts fail
    assert node.setup("127.0.0.1", "P2PHANDSHAKE", 4 * MB, 0, "tcp", "", pool[0].info["rpc"]) == 0
    assert node.put("k", b"v") < 0
    node.close()


def test_hostname_port_in_mooncakes_range(store: MooncakeDistributedStore) -> None:
    """No port in local_hostname: the Transfer Engine listens on one from 12300-14300, as
    Mooncake's does, and get_hostname() names it."""
    import socket

    host, port = store.get_hostname().rsplit(":", 1)
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    with socket.create_connection((host, int(port)), timeout=2):
        pass  # kvcake's transfer server is really there


def test_metadata_server_is_validated(master_proc: Proc) -> None:
    rpc, http = master_proc.info["rpc"], master_proc.info["http"]
    s = MooncakeDistributedStore()
    args = (16 * MB, 16 * MB, "tcp", "", rpc)
    assert s.setup("127.0.0.1", "http://127.0.0.1:1/metadata", *args) == -1  # unreachable
    assert s.setup("127.0.0.1", "etcd://127.0.0.1:1", *args) == -1
    assert s.setup("127.0.0.1", "redis://127.0.0.1:6379", *args) == -600
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "rdma", "", rpc) == -600
    assert s.setup("127.0.0.1", f"http://{http}/metadata", *args) == 0  # the master serves it
    assert s.put("k", b"v") == 0 and s.get("k") == b"v"
    assert s.close() == 0


def test_ssd_offload_client(master_proc: Proc, tmp_path: Path) -> None:
    """enable_ssd_offload: this client is a storage node with a disk tier in ssd_offload_path."""
    s = MooncakeDistributedStore()
    rc = s.setup(
        "127.0.0.1", "P2PHANDSHAKE", 8 * MB, 8 * MB, "tcp", "", master_proc.info["rpc"],
        enable_ssd_offload=True, ssd_offload_path=str(tmp_path),
    )  # fmt: skip
    assert rc == 0
    assert s.put("d", b"x" * 1000) == 0 and s.get("d") == b"x" * 1000
    assert s.unmount_local_disk_segment() == 0
    assert s.close() == 0
    bad = MooncakeDistributedStore()
    assert bad.setup(
        "127.0.0.1", "P2PHANDSHAKE", 8 * MB, 8 * MB, "tcp", "", master_proc.info["rpc"],
        enable_ssd_offload=True,
    ) == -600  # fmt: skip  # no path


def test_shim_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvcake.compat.mooncake import shim

    target = tmp_path / "site"
    pkg = shim.install(target)
    assert (pkg / shim.MARKER).is_file()
    assert [f.is_shim for f in shim.found([str(target)])] == [True]
    over = shim.install(tmp_path / "over")  # a real wheel installed over the shim afterwards
    (over / "__init__.py").write_text("from mooncake.buffer_pool import BufferPool\n")
    assert [f.is_shim for f in shim.found([str(tmp_path / "over")])] == [False]
    with pytest.raises(shim.ShimError, match="not kvcake's shim"):
        shim.uninstall(tmp_path / "over")
    real = tmp_path / "real"
    (real / "mooncake").mkdir(parents=True)
    (real / "mooncake" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(real))
    with pytest.raises(shim.ShimError, match="never shadows"):
        shim.install(tmp_path / "other")
    with pytest.raises(shim.ShimError, match="not kvcake's shim"):
        shim.uninstall(real)
    assert shim.uninstall(target) == pkg and not pkg.exists()
    assert shim.uninstall(target) is None


def test_ssd_offload_on_eviction_and_read_back(master_proc: Proc, tmp_path: Path) -> None:
    """Over the watermark the master offloads this client's objects to its disk tier; they stay
    readable (from disk) and show up as local-disk replicas."""
    s = MooncakeDistributedStore()
    rc = s.setup(
        "127.0.0.1", "P2PHANDSHAKE", 4 * MB, 4 * MB, "tcp", "", master_proc.info["rpc"],
        enable_ssd_offload=True, ssd_offload_path=str(tmp_path),
    )  # fmt: skip
    assert rc == 0
    values = {f"o{i}": bytes([i]) * (256 * 1024) for i in range(15)}  # 94% of a 4 MiB segment
    for k, v in values.items():
        assert s.put(k, v) == 0
    wait_until(lambda: [f.name for f in tmp_path.rglob("*.obj")], timeout=30, every_s=0.2,
               what="an object offloaded to the SSD tier")  # fmt: skip
    assert s.get_offload_rpc_read_count() == 0
    descs = {k: s.get_replica_desc(k) for k in values}
    disk_keys = [k for k, d in descs.items() if any(r.is_local_disk_replica() for r in d)]
    assert disk_keys
    disk_only = [k for k, d in descs.items() if d and all(r.is_local_disk_replica() for r in d)]
    assert all(s.get(k) == values[k] for k in values)  # memory or disk, every value reads back
    # Each disk-only value was read over the node's disk service (an "offload RPC read").
    assert s.get_offload_rpc_read_count() >= len(disk_only) >= 1
    assert s.close() == 0


def test_buffer_pool_and_allocators(store: MooncakeDistributedStore) -> None:
    from kvcake.compat.mooncake import store as ms

    pool = ms.BufferPool(store, max_bytes=256 * 1024, min_size_class=64 * 1024)
    a = pool.acquire(10_000)  # 64 KiB class
    assert a.size == 10_000 and a.ptr in store._registered
    a.buffer[:5] = b"hello"
    assert store.put_from("pool", a.ptr, 5) == 0
    b = pool.acquire(100_000)  # 128 KiB class: 192 KiB of 256 mapped
    with pytest.raises(MemoryError):
        pool.acquire(100_000, block=False)
    with pytest.raises(TimeoutError):
        pool.acquire(100_000, timeout=0.05)
    b.release()
    with pool.acquire(100_000) as c:  # b's region comes back
        assert c.ptr == b.ptr
        assert store.get_into("pool", c.ptr, c.size) == 5 and bytes(c.buffer[:5]) == b"hello"
    with ms.BufferPool(store, max_size_class=1024).acquire(4096) as big:  # a dedicated region
        assert big.size == len(big.buffer) == 4096 and big.ptr in store._registered
    assert big.ptr not in store._registered  # unmapped (and unregistered) on release
    view = a.buffer[:5]
    with pytest.raises(RuntimeError, match="exported views"):
        a.release()  # the region must not be recycled under a live view
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    del view
    a.release()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(1)
    assert ms.RegisteredBufferPool is ms.BufferPool
    alloc = ms.MooncakeHostMemAllocator()
    p = alloc.alloc(4096)
    assert p != 0 and alloc.free(p) == 0 and alloc.free(p) == -1
    assert ms.get_alloc_func_addr() != 0 and ms.get_free_func_addr() != 0
    head, ptr, size, _owner = ms._serialize_tensor(__import__("torch").ones(3))
    assert len(head) == ms._tensor_metadata_size() == 304 and size == 12 and ptr != 0
