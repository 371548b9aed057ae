"""A full disk tier makes room by dropping its least recently used copies (``evicted_disk``).

Fake clock, the master's state machine only: memory holds 4 objects, the disk tier 4. Offloads
of newer objects must drop the oldest disk-only objects, publish ``evicted_disk`` for exactly
those keys, ask the node to delete their files, and keep every allocator consistent; a
subscriber's view built from the events matches the master's content.
"""

from __future__ import annotations

import pytest

from kvcake.core.api import PoolView, StoreEventKind
from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.config import MasterConfig
from kvcake.store.errors import SpacePending
from kvcake.store.master_state import MasterState
from kvcake.store.metadata import Tier
from tests.store.test_master_state import Clock

NODE, W = ClientId("node-a"), ClientId("writer")
OBJ = 4096


def make() -> tuple[MasterState, Clock]:
    clock = Clock()
    # evict_step_ms=0: no wall-clock bound on a step, so a preempted step (a loaded machine)
    # cannot end an eviction round early and make the outcome depend on the machine's load
    cfg = MasterConfig(
        lease_ttl_s=1, client_ttl_s=60, high_watermark=0.9, eviction_ratio=0.5, evict_step_ms=0
    )
    st = MasterState(cfg, clock)
    st.mount(NODE, "h", SegmentName("mem"), 4 * OBJ)
    st.mount(NODE, "h", SegmentName("mem.ssd"), 4 * OBJ, Tier.DISK, "h:9")
    return st, clock


def put(st: MasterState, key: str, deletes: set[str] | None = None) -> None:
    """A put; when memory is full while offloads run (SpacePending), the node finishes them,
    as a client's retry waits for it, and the put is tried again."""
    try:
        st.put_start(W, "hw", key, OBJ)
    except SpacePending:
        finish_tasks(st, deletes)
        st.put_start(W, "hw", key, OBJ)
    st.put_end(W, key)


def finish_tasks(st: MasterState, deletes: set[str] | None = None) -> list[str]:
    """The node completes every offload it was given (and notes in ``deletes`` the files it
    was told to delete); returns the offloaded keys."""
    done = []
    for task in st.take_tasks(NODE):
        if task.kind == "offload":
            st.task_done(NODE, "offload", task.key, True)
            done.append(task.key)
        elif task.kind == "delete" and deletes is not None:
            deletes.add(task.key)
    return done


def offload_round(st: MasterState, clock: Clock, deletes: set[str] | None = None) -> list[str]:
    """Evict to the low watermark, then the node completes every offload."""
    clock.t += 2  # leases from the puts have expired
    while st.maybe_evict():
        pass
    return finish_tasks(st, deletes)


def tiers(st: MasterState, key: str) -> list[str]:
    return sorted(r.tier.value for r in st.objects[key].replicas if r.complete)  # type: ignore[index]


def test_full_disk_drops_its_lru_copies_and_publishes_them() -> None:
    st, clock = make()
    view = PoolView()
    view.load(st.kv_snapshot())
    for i in range(4):
        put(st, f"a{i}")
    first = offload_round(st, clock)
    assert first and all(tiers(st, k) == ["disk"] for k in first)
    assert not any(e.kind is StoreEventKind.EVICTED_DISK for e in st.events.take(0.0, 10_000))
    view.load(st.kv_snapshot())
    # The disk tier has room for one more: the next offloads must drop the oldest copies.
    deletes: set[str] = set()
    for i in range(4):
        put(st, f"b{i}", deletes)
    put(st, "c0", deletes)
    later = offload_round(st, clock, deletes)
    assert len(later) >= 2, later
    events = st.events.take(0.0, 10_000)
    dropped = [k for e in events if e.kind is StoreEventKind.EVICTED_DISK for k in e.keys]
    assert dropped and dropped[0] == "a0"  # the least recently used copy goes first
    assert "c0" not in dropped  # the newest object keeps its copy
    for key in dropped:
        assert key not in st.objects  # disk-only: the object is gone
    deletes |= {t.key for t in st.take_tasks(NODE) if t.kind == "delete"}
    assert set(dropped) <= deletes  # the node is told to delete the files
    assert st.parts.tiering.evicted_disk_objects == len(dropped)
    assert all(tiers(st, k) == ["disk"] for k in later)
    for e in events:
        assert view.apply(e) is not None
    assert set(view.tiers) == set(st.kv_snapshot().keys)
    st.check()


def test_copy_in_memory_survives_a_disk_eviction() -> None:
    st, clock = make()
    for i in range(4):
        put(st, f"a{i}")
    first = offload_round(st, clock)
    key = first[0]
    st.get_replicas(W, key)
    st.get_replicas(W, key)  # the second disk hit promotes it back to memory
    promos = [t for t in st.take_tasks(NODE) if t.kind == "promote"]
    assert [t.key for t in promos] == [key]
    st.task_done(NODE, "promote", key, True)
    assert tiers(st, key) == ["disk", "memory"]
    st.objects.move_to_end(key, last=False)  # make it the least recently used object
    clock.t += 2
    offload = st.objects[first[1]]  # type: ignore[index]
    freed = st.parts.tiering.evict_disk(st.segments[SegmentName("mem.ssd")], OBJ, offload.key)
    assert freed == OBJ
    assert tiers(st, key) == ["memory"]  # its disk copy went, the object stays readable
    (ev,) = [e for e in st.events.take(0.0, 10_000) if e.kind is StoreEventKind.EVICTED_DISK]
    assert ev.keys == (key,) and ev.tier == "disk"
    st.check()


def test_a_dropped_disk_copy_is_journaled_for_ha() -> None:
    """An HA master logs the object's new replica set (a new leader must not list the copy)."""
    from kvcake.store.ha.journal import JournaledState
    from kvcake.store.ha.view import ObjRec

    clock = Clock()
    # evict_step_ms=0: no wall-clock bound on a step, so a preempted step (a loaded machine)
    # cannot end an eviction round early and make the outcome depend on the machine's load
    cfg = MasterConfig(
        lease_ttl_s=1, client_ttl_s=60, high_watermark=0.9, eviction_ratio=0.5, evict_step_ms=0
    )
    st = JournaledState(cfg, clock)
    st.mount(NODE, "h", SegmentName("mem"), 4 * OBJ)
    st.mount(NODE, "h", SegmentName("mem.ssd"), 4 * OBJ, Tier.DISK, "h:9")
    for i in range(4):
        put(st, f"a{i}")
    key = offload_round(st, clock)[0]
    st.get_replicas(W, key)
    st.get_replicas(W, key)
    st.task_done(NODE, "promote", key, True)
    st.objects.move_to_end(key, last=False)  # type: ignore[arg-type]
    st.records()  # drain
    clock.t += 2
    st.parts.tiering.evict_disk(st.segments[SegmentName("mem.ssd")], OBJ, "other")  # type: ignore[arg-type]
    recs = [r for r in st.records() if isinstance(r, ObjRec) and r.key == key]
    assert recs and [tier for _, _, tier in recs[0].replicas] == ["memory"]


def test_a_put_into_full_memory_offloads_and_never_drops_an_acknowledged_object() -> None:
    """Mooncake's test_local_disk_get: every acknowledged key must stay readable. A put that
    finds memory full starts offloads and answers SpacePending (the client retries), instead
    of dropping objects that have not reached the disk yet."""
    st, clock = make()
    for i in range(4):
        put(st, f"k{i}")
    clock.t += 2
    with pytest.raises(SpacePending, match="offloaded to disk"):
        st.put_start(W, "hw", "k4", OBJ)
    assert set(st.objects) == {f"k{i}" for i in range(4)}  # nothing was dropped
    finish_tasks(st)
    st.put_start(W, "hw", "k4", OBJ)
    st.put_end(W, "k4")
    assert set(st.objects) == {f"k{i}" for i in range(5)}
    assert all(tiers(st, k) for k in st.objects)
    st.check()
