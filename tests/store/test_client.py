"""Client against real processes (master + store-server): values of every buffer kind, both
transfer paths, two-phase writes, leases, batches, removal."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kvcake.store.client import Client
from kvcake.store.errors import (
    InvalidParams,
    NoSpace,
    ObjectAlreadyExists,
    ObjectHasLease,
    ObjectNotFound,
)
from kvcake.store.protocol import PutOptions
from tests.store.procs import Proc


@pytest.fixture(params=["auto", "tcp"])
def client(request: pytest.FixtureRequest, pool: tuple[Proc, Proc]) -> Iterator[Client]:
    c = Client(master=pool[0].info["rpc"], protocol=request.param)
    yield c
    c.remove_all(force=True)
    c.close()


def test_roundtrip_buffer_kinds(client: Client) -> None:
    import torch

    rng = np.random.default_rng(1)
    arr = rng.standard_normal((64, 33)).astype(np.float32)
    tensor = torch.arange(4096, dtype=torch.float16).reshape(8, 512)
    client.put("bytes", b"hello")
    client.put("mv", memoryview(bytearray(b"x" * 3000))[1000:])
    client.put("np", arr)
    client.put_from("torch", tensor)
    assert client.get("bytes") == b"hello"
    assert client.get("mv") == b"x" * 2000
    assert np.array_equal(np.frombuffer(client.get("np"), np.float32).reshape(64, 33), arr)
    out = torch.empty_like(tensor)
    assert client.get_into("torch", out) == tensor.numel() * 2
    assert torch.equal(out, tensor)
    assert client.get_size("np") == arr.nbytes
    with pytest.raises(InvalidParams):
        client.get_into("np", bytearray(10))  # too small
    with pytest.raises(InvalidParams):
        client.get_into("bytes", b"readonly")
    with pytest.raises(InvalidParams):
        client.put("noncontig", arr[:, ::2])


def test_two_phase_semantics(client: Client) -> None:
    client.put("k", b"v1")
    with pytest.raises(ObjectAlreadyExists):
        client.put("k", b"v2")
    assert client.get("k") == b"v1"  # put never overwrites
    with pytest.raises(ObjectNotFound):
        client.get("missing")
    with pytest.raises(InvalidParams):
        client.put("", b"x")
    with pytest.raises(InvalidParams):
        client.put("empty", b"")
    with pytest.raises(NoSpace):
        client.put("huge", np.zeros(65 << 20, np.uint8))
    assert not client.is_exist("huge")  # a failed put leaves nothing behind


def test_upsert_and_remove_with_leases(client: Client) -> None:
    client.put("u", b"a" * 100)
    assert client.get("u") == b"a" * 100  # takes a lease
    with pytest.raises(ObjectHasLease):
        client.remove("u")
    with pytest.raises(ObjectHasLease):
        client.upsert("u", b"b" * 100)
    client.remove("u", force=True)
    client.upsert("u", b"c" * 100)  # insert
    client.upsert("u", b"d" * 100)  # same size: in place (no lease: no read since)
    client.upsert("u", b"e" * 5000)  # other size: reallocated
    assert client.get("u") == b"e" * 5000
    with pytest.raises(ObjectNotFound):
        client.remove("nope")


def test_batches(client: Client) -> None:
    keys = [f"b/{i}" for i in range(16)]
    vals = [bytes([i]) * (1000 + i) for i in range(16)]
    assert client.batch_put(keys, vals) == [None] * 16
    again = client.batch_put([keys[0], "b/new"], [b"zz", b"new"])
    assert isinstance(again[0], ObjectAlreadyExists) and again[1] is None
    assert client.batch_get([*keys, "b/missing"])[:16] == vals
    assert isinstance(client.batch_get(["b/missing"])[0], ObjectNotFound)
    bufs = [bytearray(2000) for _ in keys]
    assert client.batch_get_into(keys, bufs) == [len(v) for v in vals]
    assert all(bytes(b[: len(v)]) == v for b, v in zip(bufs, vals, strict=True))
    assert client.batch_is_exist([keys[3], "zz"]) == [True, False]
    with pytest.raises(InvalidParams):
        client.batch_put(keys, vals[:3])
    assert client.remove_all(pattern="b/1") == 0  # all leased by the reads above
    assert client.remove_all(force=True, pattern="b/1*") == 7  # b/1, b/10..b/15
    assert client.remove_by_regex(r"^b/\d$", force=True) == 9


def test_replicas_on_distinct_segments(pool: tuple[Proc, Proc]) -> None:
    # The client contributes its own segment: with the store-server that makes two.
    with Client(master=pool[0].info["rpc"], segment_size=8 << 20) as c:
        c.put("r", b"z" * 10000, PutOptions(replica_num=2))
        segs = [r.segment for r in c.get_replica_desc("r").replicas]
        assert len(segs) == 2 and len(set(segs)) == 2
        c.put("r3", b"y" * 100, PutOptions(replica_num=3))  # best effort: 2 segments exist
        assert len(c.get_replica_desc("r3").replicas) == 2
        c.remove_all(force=True)


def test_store_server_health_and_metrics(pool: tuple[Proc, Proc]) -> None:
    import httpx

    _, node = pool
    base = f"http://{node.info['http']}"
    health = httpx.get(f"{base}/health", timeout=5).json()
    assert health["status"] == "ok" and health["master"] == "ok"
    text = httpx.get(f"{base}/metrics", timeout=5).text
    assert "kvcake_store_node_segment_bytes 6.7108864e+07" in text
    assert "kvcake_store_node_master_reachable 1.0" in text
    assert httpx.get(f"{base}/nope", timeout=5).status_code == 404


def test_batch_get_into_ranges_scatters_parts_of_values(client: Client) -> None:
    """Parts of each value straight into separate caller buffers (the vLLM connector reads a
    pool block's layer slices into vLLM's own KV rows this way); bad ranges fail alone."""
    import threading
    import time

    from kvcake.store.readguard import ReadGuard

    rng = np.random.default_rng(2)
    vals = {f"r{i}": rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes() for i in range(3)}
    for k, v in vals.items():
        client.put(k, v)
    a, b, c = bytearray(1000), bytearray(200_000), np.zeros(50, np.float32)
    got = client.batch_get_into_ranges(
        ["r0", "r1", "r2", "missing"],
        [[(0, a), (100_000, b)], [(299_800, c)], [(299_999, bytearray(2))], [(0, bytearray(1))]],
    )
    assert got[:2] == [201_000, 200]
    assert bytes(a) == vals["r0"][:1000] and bytes(b) == vals["r0"][100_000:300_000]
    assert c.tobytes() == vals["r1"][299_800:]
    assert isinstance(got[2], InvalidParams)  # one byte past the end
    assert isinstance(got[3], ObjectNotFound)
    with pytest.raises(InvalidParams):
        client.batch_get_into_ranges(["r0"], [])
    ro = client.batch_get_into_ranges(["r0"], [[(0, memoryview(b"abc"))]])
    assert isinstance(ro[0], InvalidParams)
    guard = ReadGuard()
    guard.cancel()
    d = bytearray(10)
    assert isinstance(client.batch_get_into_ranges(["r0"], [[(0, d)]], guard)[0], Exception)
    assert d == bytearray(10)  # a cancelled read writes nothing
    guard = ReadGuard()
    lock_taken = threading.Event()

    def hold_the_commit() -> None:
        with guard.commit():  # as a copy in progress: cancel() must wait for it
            lock_taken.set()
            time.sleep(0.2)

    t = threading.Thread(target=hold_the_commit)
    t.start()
    lock_taken.wait(5)
    t0 = time.monotonic()
    guard.cancel()
    assert time.monotonic() - t0 > 0.1  # returned only once the copy was over
    t.join()


def test_ranges_given_as_tables_and_overlapping_pairs(client: Client) -> None:
    """A RangeTable (what a vLLM load hands over) reads like its pairs; a table past the value
    fails alone; overlapping pairs (no C scatter) still get their bytes."""
    from kvcake.core.ranges import RangeTable

    data = np.random.default_rng(3).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    client.put("tab", data)
    a, b = bytearray(300), bytearray(50)
    fits = RangeTable.of_pairs([(99_700, memoryview(a)), (10, memoryview(b))])
    past = RangeTable.of_pairs([(99_990, memoryview(bytearray(11)))])
    c, d = bytearray(20), bytearray(20)
    got = client.batch_get_into_ranges(["tab", "tab", "tab"], [fits, past, [(0, c), (10, d)]])
    assert got[0] == 350 and bytes(a) == data[99_700:] and bytes(b) == data[10:60]
    assert isinstance(got[1], InvalidParams)
    assert got[2] == 40 and bytes(c) == data[:20] and bytes(d) == data[10:30]


def test_a_cancel_stops_a_large_mapped_read_between_chunks(pool: tuple[Proc, Proc]) -> None:
    """issue 37: a same-host read into caller ranges is one C copy under the guard; cancel()
    sets the guard's stop flag, the copy ends at its next chunk boundary, the key fails, and
    once cancel() has returned no byte lands any more."""
    import threading
    import time

    from kvcake.core import native
    from kvcake.store.readguard import ReadGuard

    assert native.AVAILABLE
    client = Client(master=pool[0].info["rpc"])  # auto: the node's segment is mapped here
    size = 48 << 20  # 48 chunks: a copy of tens of milliseconds
    client.put("big-scatter", np.full(size, 7, np.uint8))
    dests = [np.zeros(size // 4, np.uint8) for _ in range(4)]
    ranges = [(i * (size // 4), d) for i, d in enumerate(dests)]
    guard = ReadGuard()
    out: list[object] = []
    t = threading.Thread(
        target=lambda: out.extend(client.batch_get_into_ranges(["big-scatter"], [ranges], guard))
    )
    t.start()
    while not any(d[0] for d in dests):  # the copy is under way
        time.sleep(0.0005)
    guard.cancel()
    landed = sum(int(np.count_nonzero(d)) for d in dests)
    time.sleep(0.05)
    t.join(10)
    assert sum(int(np.count_nonzero(d)) for d in dests) == landed  # nothing after cancel()
    assert landed < size and isinstance(out[0], Exception), (landed, out)
    client.remove("big-scatter", force=True)
    client.close()
