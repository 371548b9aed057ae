"""Replica copy / drop / move: the master's two-phase copy (fake clock) and the client against
real processes (a master and two storage nodes), bytes checked on the new replica itself."""

from __future__ import annotations

import numpy as np
import pytest

from kvcake.core.api import StoreEventKind
from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.client import Client
from kvcake.store.config import MasterConfig
from kvcake.store.errors import InvalidParams, ObjectNotFound, ReplicaNotReady
from kvcake.store.master_state import MasterState
from tests.store.conftest import Factory
from tests.store.test_master_state import Clock

A, B, W = ClientId("node-a"), ClientId("node-b"), ClientId("writer")


def make() -> tuple[MasterState, Clock]:
    clock = Clock()
    st = MasterState(MasterConfig(lease_ttl_s=1, client_ttl_s=60, put_start_discard_s=5), clock)
    st.mount(A, "ha", SegmentName("seg-a"), 1 << 16)
    st.mount(B, "hb", SegmentName("seg-b"), 1 << 16)
    st.put_start(W, "hw", "k", 1000)
    st.put_end(W, "k")
    return st, clock


def segs(st: MasterState, key: str, complete: bool = True) -> list[str]:
    obj = st.objects[key]  # type: ignore[index]
    return sorted(r.segment for r in obj.replicas if r.complete or not complete)


def test_copy_is_invisible_until_it_ends_and_blocks_removal_meanwhile() -> None:
    st, clock = make()
    (src,) = segs(st, "k")
    dst = "seg-b" if src == "seg-a" else "seg-a"
    (new,) = st.copy_start(W, "k", [dst])
    assert new.segment == dst and new.size == 1000
    assert segs(st, "k") == [src]  # not readable yet
    assert [r.segment for r in st.get_replicas(W, "k")[1]] == [src]
    with pytest.raises(ReplicaNotReady):
        st.copy_start(W, "k", [dst])  # one copy at a time
    clock.t += 2  # the get's lease ran out: only the copy keeps the object now
    with pytest.raises(ReplicaNotReady):
        st.remove("k")
    st.events.take(0.0, 1000)
    st.copy_end(W, "k", ok=True)
    assert segs(st, "k") == sorted([src, dst])
    (ev,) = st.events.take(0.0, 1000)
    assert ev.kind is StoreEventKind.STORED and ev.keys == ("k",)
    st.check()


def test_failed_or_abandoned_copies_free_their_space() -> None:
    st, clock = make()
    (src,) = segs(st, "k")
    dst = "seg-b" if src == "seg-a" else "seg-a"
    free = st.segments[SegmentName(dst)].allocator.free
    st.copy_start(W, "k", [dst])
    st.copy_end(W, "k", ok=False)
    assert segs(st, "k", complete=False) == [src]
    # The copier may still be writing into its range: it comes back after the writer's grace
    # (MasterConfig.writer_grace_s: here the client TTL, 60 s), not at once.
    assert st.segments[SegmentName(dst)].allocator.free < free
    clock.t += 59
    st.maybe_evict()
    assert st.segments[SegmentName(dst)].allocator.free < free
    clock.t += 2
    st.maybe_evict()
    assert st.segments[SegmentName(dst)].allocator.free == free
    st.copy_start(W, "k", [dst])
    assert st.sweep_copies(lambda c: True) == 0  # young, client alive
    clock.t += 6
    assert st.sweep_copies(lambda c: True) == 1  # older than put_start_discard_s
    assert segs(st, "k", complete=False) == [src] and not st.copies
    st.copy_start(W, "k", [dst])
    assert st.sweep_copies(lambda c: c != W) == 1  # the copying client is gone
    with pytest.raises(InvalidParams):
        st.copy_end(W, "k", ok=True)  # its copy was aborted
    clock.t += 61
    st.maybe_evict()
    assert st.segments[SegmentName(dst)].allocator.free == free
    st.check()


def test_bad_copy_and_drop_requests_are_refused() -> None:
    st, _ = make()
    (src,) = segs(st, "k")
    for targets in ([], ["seg-a", "seg-a"], ["nope"], [src]):
        with pytest.raises(InvalidParams):
            st.copy_start(W, "k", targets)
    with pytest.raises(ObjectNotFound):
        st.copy_start(W, "missing", ["seg-b"])
    with pytest.raises(InvalidParams):
        st.drop_replica(W, "k", src)  # the last readable replica
    with pytest.raises(InvalidParams):
        st.drop_replica(W, "k", "nope")
    with pytest.raises(InvalidParams):
        st.copy_end(W, "k", ok=True)  # no copy in progress
    st.check()


def test_dropping_a_leased_replica_keeps_its_space_until_the_lease_ends() -> None:
    st, clock = make()
    (src,) = segs(st, "k")
    dst = "seg-b" if src == "seg-a" else "seg-a"
    st.copy_start(W, "k", [dst])
    st.copy_end(W, "k", ok=True)
    st.get_replicas(W, "k")  # a reader's lease
    before = st.segments[SegmentName(src)].allocator.free
    st.drop_replica(W, "k", src)
    assert segs(st, "k") == [dst]
    assert st.segments[SegmentName(src)].allocator.free == before  # not reusable yet
    clock.t += 2
    st.maybe_evict()  # housekeeping reclaims discarded space
    assert st.segments[SegmentName(src)].allocator.free > before
    assert st.segments[SegmentName(src)].allocator.free == 1 << 16  # nothing else lives there
    st.check()


def test_client_copies_and_moves_between_real_nodes(procs: Factory) -> None:
    master = procs("master", "--port", "0", "--http-port", "0", "--client-ttl-s", "2")
    rpc = master.info["rpc"]
    nodes = [
        procs("store-server", "--master", rpc, "--segment-size", "8MiB", "--name", name)
        for name in ("node-1", "node-2")
    ]
    names = [n.info["segment"] for n in nodes]
    value = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8)
    with Client(master=rpc, protocol="tcp") as c:
        c.put("obj", value)
        (rep,) = c.get_replica_desc("obj").replicas
        assert rep.segment in names
        other = next(s for s in names if s != rep.segment)
        c.copy_replica("obj", [other])
        reps = {r.segment: r for r in c.get_replica_desc("obj").replicas}
        assert set(reps) == {rep.segment, other}
        got = bytearray(value.nbytes)
        c.engine.read_into(other, reps[other].offset, got)  # the new replica's own bytes
        assert got == value.tobytes()
        c.drop_replica("obj", rep.segment)
        assert [r.segment for r in c.get_replica_desc("obj").replicas] == [other]
        assert c.get("obj") == value.tobytes()
        c.move_replica("obj", other, rep.segment)
        assert [r.segment for r in c.get_replica_desc("obj").replicas] == [rep.segment]
        assert c.get("obj") == value.tobytes()
        with pytest.raises(InvalidParams):
            c.copy_replica("obj", ["no-such-segment"])
        with pytest.raises(ObjectNotFound):
            c.copy_replica("missing", [other])
        assert c.get("obj") == value.tobytes()  # refusals left the object intact
