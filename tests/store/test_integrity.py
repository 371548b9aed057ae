"""Integrity end to end over real processes: a master and two store-servers; clients in this
process. A replica whose bytes were changed in the node's memory is never served: the reader
falls through to a good replica or raises IntegrityError, the master drops exactly the bad
replica, and another key's bytes at the right size never verify."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator

import msgspec
import pytest
from prometheus_client import REGISTRY

from kvcake.core import framing
from kvcake.core.integrity import CHUNK, checksums
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig
from kvcake.store.errors import IntegrityError, InvalidParams, ObjectNotFound, TransferFailed
from kvcake.store.readguard import ReadGuard
from tests.store.conftest import _factory

SEED = 30


@pytest.fixture(scope="module")
def pool2() -> Iterator[str]:
    """A master and two 32 MiB store-servers shared by the module; yields the master's RPC."""
    start, started = _factory()
    try:  # a node that fails to start must not leave the master running
        master = start("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "2")
        rpc = master.info["rpc"]
        for name in ("na", "nb"):
            start("store-server", "--master", rpc, "--segment-size", "32MiB", "--name", name,
                  "--http-port", "-1")  # fmt: skip
        yield rpc
    finally:
        for p in reversed(started):
            p.stop()


def value(key: str, size: int) -> bytes:
    return random.Random(f"{SEED}/{key}").randbytes(size)


def corrupt(c: Client, rep: P.ReplicaDesc, at: int) -> None:
    """Flip one byte of a replica in its node's memory (through the Transfer Engine: a
    stand-in for a bit flip, a stray write or a range reused under a stale master)."""
    b = bytearray(1)
    c.engine.read_into(rep.segment, rep.offset + at, b)
    b[0] ^= 0xFF
    c.engine.write(rep.segment, rep.offset + at, b)


def failures(path: str) -> float:
    got = REGISTRY.get_sample_value("kvcake_store_integrity_failures_total", {"path": path})
    return got or 0.0


def first(c: Client, key: str) -> P.ReplicaDesc:
    return c.reads.order(c.get_replica_desc(key).replicas)[0]


@pytest.mark.parametrize("protocol", ["auto", "tcp"])
def test_a_bad_replica_falls_through_to_the_good_one_and_is_dropped(
    pool2: str, protocol: str
) -> None:
    path = "shm" if protocol == "auto" else "tcp"
    with Client(ClientConfig(master=pool2, protocol=protocol)) as c:
        for size in (4096, 2 * CHUNK + 777):  # one chunk; three, the last one short
            key = f"two/{protocol}/{size}"
            c.put(key, value(key, size), P.PutOptions(replica_num=2))
            bad = first(c, key)
            corrupt(c, bad, size - 1)
            before = failures(path)
            assert c.get(key) == value(key, size)  # from the other replica
            assert failures(path) == before + 1
            left = c.get_replica_desc(key).replicas
            assert [(r.segment, r.offset) for r in left] != [(bad.segment, bad.offset)]
            assert len(left) == 1 and left[0].segment != bad.segment  # only the bad one went
            corrupt(c, left[0], 0)  # now the last one too: refused, and the object dropped
            with pytest.raises(IntegrityError, match=key):
                c.get(key)
            with pytest.raises(ObjectNotFound):
                c.get(key)


def _read(c: Client, api: str, key: str, size: int) -> tuple[object, bool]:
    """The outcome of one read API on ``key``, and whether the caller's range buffer still
    holds its sentinel (no unverified byte reached it)."""
    buf = bytearray(size)
    sentinel = b"\xab" * 100
    part = bytearray(sentinel)  # a range inside one chunk: the whole chunk must verify
    calls = {
        "get": lambda: c.get(key),
        "get_into": lambda: c.get_into(key, buf),
        "batch_get": lambda: c.batch_get([key, key + "/ok"])[0],  # staged: two remote values
        "batch_get_into": lambda: c.batch_get_into([key], [buf])[0],
        "ranges": lambda: c.batch_get_into_ranges([key], [[(size // 2, part)]])[0],
        "ranges_guarded": lambda: c.batch_get_into_ranges(
            [key], [[(size // 2, part)]], ReadGuard()
        )[0],
    }
    try:
        got = calls[api]()
    except Exception as exc:
        got = exc
    return got, bytes(part) == sentinel


@pytest.mark.parametrize("protocol", ["auto", "tcp"])
def test_no_read_api_returns_a_corrupt_single_replica(pool2: str, protocol: str) -> None:
    size = 64 * 1024
    with Client(ClientConfig(master=pool2, protocol=protocol)) as c:
        for api in ("get", "get_into", "batch_get", "batch_get_into", "ranges", "ranges_guarded"):
            key = f"one/{protocol}/{api}"
            c.put(key, value(key, size))
            c.put(key + "/ok", value(key + "/ok", size))
            corrupt(c, first(c, key), size // 2 + 10)
            got, untouched = _read(c, api, key, size)
            assert isinstance(got, IntegrityError), (api, got)
            if api == "ranges_guarded" and protocol == "tcp":  # a network read lands privately
                assert untouched, "an unverified byte reached the caller"
            # (a mapped copy goes straight into the ranges, summed as it lands, and the key
            # fails: its buffers are undefined, as after any failed read; docs/store.md)
            with pytest.raises(ObjectNotFound):  # the corrupt last replica was dropped
                c.get(key)
            assert c.get(key + "/ok") == value(key + "/ok", size)


def test_batch_get_staged_verifies_each_value(pool2: str) -> None:
    """Several small remote values go through the staging buffer in one engine batch."""
    with Client(ClientConfig(master=pool2)) as c:
        keys = [f"staged/{i}" for i in range(8)]
        for k in keys:
            c.put(k, value(k, 8192), P.PutOptions(replica_num=2))
        corrupt(c, first(c, keys[3]), 100)
        got = c.batch_get(keys)
        assert got == [value(k, 8192) for k in keys]  # keys[3] from its second replica
        assert len(c.get_replica_desc(keys[3]).replicas) == 1


def test_another_keys_bytes_at_the_same_size_never_verify(pool2: str) -> None:
    size = CHUNK + 4096
    with Client(ClientConfig(master=pool2)) as c:
        c.put("swap/a", value("swap/a", size))
        c.put("swap/b", value("swap/b", size))
        a, b = first(c, "swap/a"), first(c, "swap/b")
        raw = bytearray(size)
        c.engine.read_into(b.segment, b.offset, raw)
        c.engine.write(a.segment, a.offset, raw)  # "a" now holds b's exact bytes
        with pytest.raises(IntegrityError):
            c.get("swap/a")
        assert c.get("swap/b") == value("swap/b", size)


def test_own_segment_reads_verify(pool2: str) -> None:
    with Client(ClientConfig(master=pool2, segment_size=4 << 20)) as c:
        own = next(iter(c.segments))
        key = "own/k"
        c.put(key, value(key, 3 * CHUNK), P.PutOptions(preferred_segments=[own]))
        rep = first(c, key)
        assert rep.segment == own
        c.segments[own][rep.offset + CHUNK + 1] ^= 0x01
        before = failures("own")
        with pytest.raises(IntegrityError):
            c.get(key)
        assert failures("own") == before + 1


def test_writers_may_pass_their_checksums(pool2: str) -> None:
    with Client(ClientConfig(master=pool2)) as c:
        v = value("given", 5000)
        c.put("given", v, checksums=checksums("given", v))
        assert c.get("given") == v
        assert c.get_replica_desc("given").sums == checksums("given", v)
        with pytest.raises(InvalidParams, match="malformed"):
            c.put("given2", v, checksums=[1, 2])  # two sums for one chunk
        other = checksums("other-key", v)  # well formed, wrong: the object never verifies
        c.put("given3", v, checksums=other)
        with pytest.raises(IntegrityError):
            c.get("given3")


def test_malformed_putend_checksums_are_typed_errors(pool2: str) -> None:
    with Client(ClientConfig(master=pool2)) as c:
        for i, sums in enumerate(([], [1, 2], [-1], [(1 << 64) - 1, 5])):
            key = f"bad-sums/{i}"
            c.conn.call(P.PutStart(c.id, c.host, [key], [100]))
            reply = c.conn.call(P.PutEnd(c.id, [key], sums=[sums]))
            if sums == []:  # "no sums" for this key: accepted, never verifiable
                assert reply.results[0].code == 0
                with pytest.raises(IntegrityError):
                    c.get(key)
                continue
            assert reply.results[0].code == InvalidParams.default_code, sums
            assert not c.is_exist(key)  # the failed put holds no space
        c.conn.call(P.PutStart(c.id, c.host, ["bad-sums/n"], [100]))
        with pytest.raises(InvalidParams, match="differ"):  # a list per key, or none
            c.conn.call(P.PutEnd(c.id, ["bad-sums/n"], sums=[[1], [2]]))
        _raw_putend_with_a_huge_sum(pool2)
        c.put("after", b"x" * 10)  # the master survived all of it
        assert c.get("after") == b"x" * 10


def _raw_putend_with_a_huge_sum(rpc: str) -> None:
    """A checksum beyond 64 bits cannot be msgpack-encoded by our client: hand-craft the
    frame with a float and a string where a sum belongs; the master answers with an error."""
    import socket

    host, port = rpc.rsplit(":", 1)
    for junk in (2.0**70, "x" * 9):
        meta = msgspec.msgpack.encode({"type": "PutEnd", "client": "w", "keys": ["k"],
                                       "sums": [[junk]]})  # fmt: skip
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(framing.pack_header(1, len(meta)) + meta)
            hdr = framing.read_header(s)
            assert hdr is not None
            body = bytearray(hdr.meta_len)
            framing.recv_exact_into(s, memoryview(body))
            reply = P.REPLY_CODEC.decode(body)
            assert reply.code != 0


@pytest.mark.parametrize("protocol", ["auto", "tcp"])
def test_ranges_across_chunks_read_exactly(pool2: str, protocol: str) -> None:
    """Ranges that start and end mid-chunk and straddle chunk boundaries: every covered chunk
    is fetched whole and verified, and exactly the asked-for bytes reach each buffer."""
    size = 2 * CHUNK + 12345
    key = f"ranges/{protocol}"
    v = value(key, size)
    cuts = [(5, 100), (CHUNK - 10, 20), (CHUNK + 7, CHUNK), (size - 3, 3)]
    with Client(ClientConfig(master=pool2, protocol=protocol)) as c:
        c.put(key, v)
        for guard in (None, ReadGuard()):
            bufs = [bytearray(n) for _, n in cuts]
            asked = [(o, b) for (o, _), b in zip(cuts, bufs, strict=True)]
            got = c.batch_get_into_ranges([key], [asked], guard)
            assert got == [sum(n for _, n in cuts)]
            assert [bytes(b) for b in bufs] == [v[o : o + n] for o, n in cuts]


@pytest.mark.parametrize("where", ["shm", "tcp", "own"])
def test_large_puts_sum_while_copying_and_get_the_same_sums(
    pool2: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put sums its values once: up to one chunk of them while its PutStart is at the
    master (then they are in L2 for the copy), larger ones as they are copied (own segment, a
    mapped peer) or as each piece is sent (TCP), never in a pass of their own over memory:
    the master gets exactly core.integrity's sums either way."""
    import kvcake.store.puts as client_mod

    checksums_of = client_mod.integrity.checksums
    summed: list[str] = []
    early: list[bool] = []

    def no_second_pass(key: str, view: memoryview) -> list[int]:
        if memoryview(view).nbytes > CHUNK or key in summed:
            raise AssertionError(f"{key!r} was summed in a pass of its own")
        summed.append(key)
        early.append(sys._getframe(1).f_code.co_name == "run")  # in _sum_small's meanwhile
        return checksums_of(key, view)

    monkeypatch.setattr(client_mod.integrity, "checksums", no_second_pass)
    protocol = "tcp" if where == "tcp" else "auto"
    seg = 8 << 20 if where == "own" else 0
    with Client(ClientConfig(master=pool2, protocol=protocol, segment_size=seg)) as c:
        opts = P.PutOptions(preferred_segments=list(c.segments)) if where == "own" else None
        for size in (300 * 1024, 2 * CHUNK + 4097):
            key = f"fused/{where}/{size}"
            v = value(key, size)
            c.put(key, v, opts)
            desc = c.get_replica_desc(key)
            assert desc.sums == checksums(key, v)
            assert (desc.replicas[0].segment in c.segments) == (where == "own")
            assert c.get(key) == v
        assert summed == [f"fused/{where}/{300 * 1024}"] and early == [True]
        # a batch sums at most one chunk early; the others as they are copied or sent
        keys = [f"fused3/{where}/{i}" for i in range(3)]
        vals = [value(k, 600 * 1024) for k in keys]
        assert c.batch_put(keys, vals, opts) == [None] * 3
        later = [] if where == "tcp" else keys[1:]  # summed by the copy (mapped) or as sent
        assert summed[1:] == keys[:1] + later and early[1:] == [True] + [False] * len(later)
        assert [c.get_replica_desc(k).sums for k in keys] == [
            checksums(k, v) for k, v in zip(keys, vals, strict=True)
        ]


@pytest.mark.parametrize("protocol", ["auto", "tcp"])
def test_a_batched_range_read_settles_each_key_alone(pool2: str, protocol: str) -> None:
    """issue 37: one load's keys go through one C scatter-and-sum (same host) or one Transfer
    Engine batch (TCP: store/netreads.py); a key whose first replica is corrupt falls through
    to its good one (reported and dropped), a key with no good replica is IntegrityError, the
    others are read as they are -- in one call, under a guard."""
    size = CHUNK + 4097
    path = "shm" if protocol == "auto" else "tcp"
    with Client(ClientConfig(master=pool2, protocol=protocol)) as c:
        keys = [f"batch/{path}/two", f"batch/{path}/one", f"batch/{path}/ok"]
        c.put(keys[0], value(keys[0], size), P.PutOptions(replica_num=2))
        for k in keys[1:]:
            c.put(k, value(k, size))
        bad = first(c, keys[0])
        corrupt(c, bad, size - 5)
        corrupt(c, first(c, keys[1]), 3)
        before = failures(path)
        bufs = {k: [bytearray(1000), bytearray(size - 2000)] for k in keys}
        asked = [[(0, bufs[k][0]), (2000, bufs[k][1])] for k in keys]
        got = c.batch_get_into_ranges(keys, asked, ReadGuard())
        assert got[0] == got[2] == size - 1000 and isinstance(got[1], IntegrityError), got
        for k in (keys[0], keys[2]):
            v = value(k, size)
            assert bytes(bufs[k][0]) == v[:1000] and bytes(bufs[k][1]) == v[2000:]
        assert failures(path) == before + 2
        left = c.get_replica_desc(keys[0]).replicas
        assert len(left) == 1 and (left[0].segment, left[0].offset) != (bad.segment, bad.offset)
        with pytest.raises(ObjectNotFound):
            c.get(keys[1])


def test_a_cancelled_batched_network_read_lands_nothing(pool2: str) -> None:
    """The batched TCP ranges read (store/netreads.py) hands bytes over only under the guard:
    cancelled before its batch returns, no key's buffer gets a byte."""
    size = 2 * CHUNK + 11
    with Client(ClientConfig(master=pool2, protocol="tcp")) as c:
        keys = [f"cancel/net/{i}" for i in range(3)]
        for k in keys:
            c.put(k, value(k, size))
        guard = ReadGuard()
        engine_read_many = c.engine.read_many

        def cancel_midway(items):  # type: ignore[no-untyped-def]
            result = engine_read_many(items)
            guard.cancel()  # the caller gives up while the bytes sit in scratch
            return result

        c.engine.read_many = cancel_midway
        bufs = [bytearray(b"\xab" * 5000) for _ in keys]
        got = c.batch_get_into_ranges(keys, [[(100, b)] for b in bufs], guard)
        assert all(isinstance(g, TransferFailed) for g in got), got
        assert all(b == b"\xab" * 5000 for b in bufs)


@pytest.mark.parametrize("verify", [True, False])
def test_a_tiled_network_read_lands_in_place_and_settles_each_key(pool2: str, verify: bool) -> None:
    """issue 37: ranges that tile a value (a vLLM block's planes) are read over TCP straight
    into place, summed as they land (transfer/scatter.py), no scratch. A key whose first
    replica is corrupt falls through to its good one (reported, dropped), a key with no good
    replica is IntegrityError; with verification off the bytes are taken as they come."""
    size = CHUNK + 4097
    tag = "v" if verify else "u"
    with Client(ClientConfig(master=pool2, protocol="tcp", verify=verify)) as c:
        keys = [f"tiled/{tag}/two", f"tiled/{tag}/one", f"tiled/{tag}/ok"]
        c.put(keys[0], value(keys[0], size), P.PutOptions(replica_num=2))
        for k in keys[1:]:
            c.put(k, value(k, size))
        direct = []
        read_scatter = c.engine.read_scatter

        def counted(segment, reads, gate, chunk):  # type: ignore[no-untyped-def]
            direct.append(len(reads))
            return read_scatter(segment, reads, gate, chunk)

        c.engine.read_scatter = counted  # type: ignore[method-assign]
        if verify:
            bad = first(c, keys[0])
            corrupt(c, bad, size - 5)
            corrupt(c, first(c, keys[1]), 3)
        before = failures("tcp")
        bufs = {
            k: [bytearray(1000), bytearray(CHUNK), bytearray(size - 1000 - CHUNK)] for k in keys
        }
        asked = [[(0, b[0]), (1000, b[1]), (1000 + CHUNK, b[2])] for b in bufs.values()]
        got = c.batch_get_into_ranges(keys, asked, ReadGuard())
        # every key the direct way first; verified, the per-key retries of the two corrupt keys
        # too (3 replica reads, each into the retry's private scratch, as large TCP reads go)
        assert sum(direct) == (6 if verify else 3), direct
        good = [keys[0], keys[2]] if verify else keys
        for k in good:
            assert got[keys.index(k)] == size
            assert b"".join(bytes(b) for b in bufs[k]) == value(k, size)
        if verify:
            assert isinstance(got[1], IntegrityError), got
            assert failures("tcp") == before + 2
            left = c.get_replica_desc(keys[0]).replicas
            assert len(left) == 1 and (left[0].segment, left[0].offset) != (bad.segment, bad.offset)


@pytest.mark.parametrize("verify", [True, False])
def test_large_network_gets_land_straight_in_their_buffers(
    pool2: str, verify: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values of 256 KiB and more over TCP (get, get_into, batch_get) are received straight
    into the buffer handed back, by the C receive, summed as they land (one scattered read per
    call); a corrupt replica still falls through to the good one and is dropped."""
    sizes = [CHUNK + 5000, 300 * 1024, 2 * CHUNK]
    with Client(ClientConfig(master=pool2, protocol="tcp", verify=verify)) as c:
        calls: list[int] = []
        real = c.engine.read_scatter

        def counted(segment, reads, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(len(reads))
            return real(segment, reads, *args, **kwargs)

        monkeypatch.setattr(c.engine, "read_scatter", counted)
        keys = [f"direct/{verify}/{n}" for n in sizes]
        for k, n in zip(keys, sizes, strict=True):
            c.put(k, value(k, n), P.PutOptions(replica_num=2))
        assert c.get(keys[0]) == value(keys[0], sizes[0])
        buf = bytearray(sizes[1] + 10)
        assert c.get_into(keys[1], buf) == sizes[1]
        assert buf[: sizes[1]] == value(keys[1], sizes[1])
        assert c.batch_get(keys) == [value(k, n) for k, n in zip(keys, sizes, strict=True)]
        # get, get_into; then the batch: one scattered read per node holding a best replica
        assert calls[:2] == [1, 1] and sum(calls[2:]) == 3 and len(calls) <= 4, calls
        if not verify:
            return
        corrupt(c, first(c, keys[2]), CHUNK + 1)
        before = failures("tcp")
        assert c.batch_get(keys) == [value(k, n) for k, n in zip(keys, sizes, strict=True)]
        assert failures("tcp") == before + 1  # found by the direct read, reported by the retry
        assert len(c.get_replica_desc(keys[2]).replicas) == 1
        corrupt(c, first(c, keys[0]), 7)
        assert c.get(keys[0]) == value(keys[0], sizes[0])
        assert failures("tcp") == before + 2


def test_a_direct_read_of_a_segment_nobody_serves_goes_the_other_way(pool2: str) -> None:
    """fetch_direct never raises for a read it cannot do (here a segment no node serves): it
    answers None, and the caller's per-key path reports the failure as that key's error."""
    from kvcake.core.ranges import RangeTable
    from kvcake.store.netreads import NetRead, fetch_direct

    with Client(ClientConfig(master=pool2, protocol="tcp")) as c:
        out = bytearray(CHUNK)
        table = RangeTable.of_pairs([(0, memoryview(out))])
        assert fetch_direct(c.engine, [NetRead("k", None, CHUNK, 0, CHUNK, "gone", 0, table)]) == [
            None
        ]
