"""Write fences end to end (docs/store.md, "Write fences"): a writer whose put was revoked
writes on after its range has waited out the writer's grace and gone to another put. Real
master and storage-node processes; the writer is a client over TCP. With its fence the node
refuses the write and the other put reads back intact; the same write without a fence (what
every write was before) lands and turns the other put into an ``IntegrityError``."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from kvcake.core.clocks import boottime
from kvcake.core.errors import TransferError
from kvcake.store import protocol as P
from kvcake.store.client import Client, ClientConfig
from kvcake.store.errors import IntegrityError, WriteLeaseExpired
from kvcake.store.fences import FENCE_GAP, Fences, first_fence, write_deadline
from tests.store.procs import Proc, spawn
from tests.waits import wait_until

SIZE = 256 << 10
GRACE_S = 2.0  # the master's writer's grace here (client TTL and put-start discard)


NODE_HTTP: list[str] = []


@pytest.fixture(scope="module")
def pool() -> Iterator[str]:
    master = spawn("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", str(GRACE_S),
                   "--put-start-discard-s", str(GRACE_S), ready="master")  # fmt: skip
    node: Proc | None = None
    try:
        node = spawn("store-server", "--master", master.info["rpc"], "--segment-size", "8MiB",
                     ready="store-server")  # fmt: skip
        NODE_HTTP[:] = [node.info["http"]]
        yield master.info["rpc"]
    finally:
        if node is not None:
            node.stop()
        master.stop()


def _refused() -> float:
    """The node's ``kvcake_store_node_stale_writes_refused_total``."""
    text = httpx.get(f"http://{NODE_HTTP[0]}/metrics", timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith("kvcake_store_node_stale_writes_"))
    return float(line.split()[-1])


def _start(c: Client, key: str) -> P.ReplicaDesc:
    reply = c.conn.call(P.PutStart(c.id, c.host, [key], [SIZE], P.PutOptions(), False))
    assert reply.results[0].code == 0, reply
    return reply.results[0].replicas[0]


def _reused(pool: str, writer: Client, other: Client, key: str) -> P.ReplicaDesc:
    """``writer`` starts a put of ``key`` and revokes it (its write timed out, say) without
    ever writing; once the grace has passed ``other`` puts ``key + '-b'`` into the same range
    and the node has heard of it. Returns the revoked put's replica."""
    stale = _start(writer, key)
    writer.conn.call(P.PutRevoke(writer.id, [key]))
    time.sleep(GRACE_S + 0.5)
    other.put(key + "-b", b"\xbb" * SIZE)
    got = other.conn.call(P.GetReplicas(other.id, [key + "-b"])).results[0].replicas[0]
    assert (got.segment, got.offset) == (stale.segment, stale.offset), "not the same range"
    assert got.fence > stale.fence > 0
    time.sleep(2 * GRACE_S / 3 + 0.5)  # the node's next heartbeat brought the allocation
    return stale


def test_a_stale_writer_is_refused_and_the_new_put_survives(pool: str) -> None:
    with (
        Client(ClientConfig(master=pool, protocol="tcp")) as writer,
        Client(ClientConfig(master=pool)) as other,
    ):
        stale = _reused(pool, writer, other, "k1")
        refused = _refused()
        with pytest.raises(TransferError, match="newer allocation"):
            writer.engine.write(stale.segment, stale.offset, b"\xaa" * SIZE, fence=stale.fence)
        # the put path sends the fence too: one value (the engine's inline path), a staged
        # batch of small ones (one vectored frame), values in slices over the lanes
        half = msgspec.structs.replace(stale, offset=stale.offset + SIZE // 2, size=SIZE // 2)
        bad = memoryview(b"\xaa" * SIZE)
        for writes in (
            [("k1", bad, stale)],
            [("k1", bad[: SIZE // 2], stale), ("k1x", bad[: SIZE // 2], half)],
        ):
            failed = writer.writes.write_all(writes, None)
            assert sorted(failed) == sorted({k for k, _, _ in writes}), failed
        assert other.get("k1-b") == b"\xbb" * SIZE
        assert _refused() >= refused + 3  # counted by the node (its metrics)


def test_without_its_fence_the_same_write_destroys_the_new_put(pool: str) -> None:
    """The control: what the fence prevents happens (the checksums then refuse the read)."""
    with (
        Client(ClientConfig(master=pool, protocol="tcp")) as writer,
        Client(ClientConfig(master=pool)) as other,
    ):
        stale = _reused(pool, writer, other, "k2")
        writer.engine.write(stale.segment, stale.offset, b"\xaa" * SIZE)  # fence 0: unchecked
        with pytest.raises(IntegrityError):
            other.get("k2-b")


def test_a_same_host_writer_past_its_write_lease_copies_nothing(pool: str) -> None:
    """No server stands between a same-host writer and the node's memory, so no fence is
    checked there; its write lease is: a copy is not started once the writer's grace has
    passed since its PutStart was sent. The control (no deadline) destroys the other put."""
    with Client(ClientConfig(master=pool)) as writer, Client(ClientConfig(master=pool)) as other:
        sent = boottime()
        stale = _reused(pool, writer, other, "k3")  # (sleeps past the grace: the "pause")
        assert writer.engine.reads_by_mapping(stale.segment), "not a same-host copy"
        deadline = write_deadline(sent, int(GRACE_S * 1000))
        failed = writer.writes.write_all(
            [("k3", memoryview(b"\xaa" * SIZE), stale)], None, deadline
        )
        assert isinstance(failed.get("k3"), WriteLeaseExpired)
        assert other.get("k3-b") == b"\xbb" * SIZE
        assert not writer.writes.write_all([("k3", memoryview(b"\xaa" * SIZE), stale)], None)
        with pytest.raises(IntegrityError):
            other.get("k3-b")


def test_current_writers_are_never_refused(pool: str) -> None:
    """Puts over TCP (single, a staged batch of small values, a batch in slices) after the
    node has noted newer allocations than theirs elsewhere in its segment: a fence is checked
    only against the bytes it writes."""
    with Client(ClientConfig(master=pool, protocol="tcp")) as c:
        slow = _start(c, "slow")  # allocated first, written last
        for i in range(3):
            c.put(f"p{i}", bytes([i]) * SIZE)
        time.sleep(2 * GRACE_S / 3 + 0.5)  # the node has noted them all
        assert not c.batch_put([f"q{i}" for i in range(4)], [b"q" * 4096] * 4)[0]
        c.engine.write(slow.segment, slow.offset, b"s" * SIZE, fence=slow.fence)
        c.conn.call(P.PutEnd(c.id, ["slow"]))
        assert c.get("q3") == b"q" * 4096 and c.get("p2") == b"\x02" * SIZE


def test_a_batch_shares_one_fence_and_the_next_request_gets_a_higher_one(pool: str) -> None:
    """One fence per request: the client writes a batch's values as one frame (a fence per
    key split it into a write per key: -17 % on batched puts over TCP, docs/benchmarks.md)."""
    with Client(ClientConfig(master=pool)) as c:
        keys = ["b1", "b2", "b3"]
        first = c.conn.call(P.PutStart(c.id, c.host, keys, [4096] * 3, P.PutOptions(), False))
        again = c.conn.call(P.PutStart(c.id, c.host, ["b4"], [4096], P.PutOptions(), False))
        fences = {r.replicas[0].fence for r in first.results}
        assert len(fences) == 1 and again.results[0].replicas[0].fence > fences.pop()
        assert first.write_lease_ms == int(GRACE_S * 1000)
        c.conn.call(P.PutRevoke(c.id, [*keys, "b4"]))


def test_only_a_reuse_of_a_tainted_range_is_noted() -> None:
    """A range freed after the writer's grace is tainted; the allocations that overlap it are
    noted (and take the overlap out of the taint), other allocations are not."""
    f = Fences(base=1)
    f.taint("s", 100, 100)
    assert not f.untaint("s", 0, 100) and not f.untaint("s", 200, 50) and not f.untaint("t", 100, 9)
    assert f.untaint("s", 120, 30)
    assert f.tainted("s") == [(100, 120), (150, 200)]
    assert f.untaint("s", 0, 1000) and f.tainted("s") == []
    f.forget_segment("s")


def test_a_writer_of_an_earlier_master_is_refused_by_the_floor(tmp_path: Path) -> None:
    """``--state-dir``: the master SIGKILLed with a put started and unwritten, restarted from
    its log. Its segments' floors are above every fence of the last master: the put's writer
    is refused although nothing reused its range."""
    flags = ["--port", "0", "--http-port", "-1", "--state-dir", str(tmp_path)]
    master = spawn("master", *flags, ready="master")
    node: Proc | None = None
    try:
        node = spawn("store-server", "--master", master.info["rpc"], "--segment-size", "8MiB",
                     ready="store-server")  # fmt: skip
        with Client(ClientConfig(master=master.info["rpc"], protocol="tcp")) as w:
            stale = _start(w, "k")
            port = master.info["rpc"].rsplit(":", 1)[1]
            master.stop(signal.SIGKILL)
            master = spawn("master", *flags[:1], port, *flags[2:], ready="master")
            wait_until(lambda: w.put("after", b"x" * SIZE) is None, timeout=30, every_s=0.5,
                       ignore=(Exception,), what="the node mounted on the new master")  # fmt: skip
            time.sleep(1.0)  # (the node's floors come with its mount reply)
            with pytest.raises(TransferError, match="floor"):
                w.engine.write(stale.segment, stale.offset, b"\xaa" * SIZE, fence=stale.fence)
            assert w.get("after") == b"x" * SIZE
    finally:
        if node is not None:
            node.stop()
        master.stop()


def test_fences_only_grow_across_restarts_and_leaders() -> None:
    """A master starts at the clock or FENCE_GAP above the floor its log remembers, and a
    batch's ranges share one fence."""
    before = Fences()
    issued = [before.next() for _ in range(5)]
    assert issued == sorted(set(issued))
    again = Fences(first_fence(before.base))  # a new leader that replayed ``before``'s floor
    assert again.next() > before.base + FENCE_GAP - 1 >= issued[-1]
    far = before.base + 10 * FENCE_GAP  # a floor far ahead of this clock (a skewed leader)
    assert Fences(first_fence(far)).next() > far
    notes = Fences()
    notes.note("n1", ("s", 0, 10, 5))  # type: ignore[arg-type]
    notes.note("n1", ("s", 10, 10, 6))  # type: ignore[arg-type]
    assert notes.take("n1", 5) == [("s", 10, 10, 6)]  # type: ignore[arg-type]
    assert notes.take("n1", 6) == [] and notes.pending() == 0  # type: ignore[arg-type]
    notes.note("n1", ("s", 0, 10, 9))  # type: ignore[arg-type]
    notes.note("n1", ("s", 10, 10, 8))  # type: ignore[arg-type]  # (taken first, noted last)
    assert [n[3] for n in notes.take("n1", 0)] == [8, 9]  # type: ignore[arg-type]
    assert write_deadline(10.0, 0) == float("inf")  # a master that sets no lease
    assert write_deadline(10.0, 2000) == pytest.approx(11.9)
