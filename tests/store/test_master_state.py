"""Master state machine: two-phase puts, placement, leases, pins, eviction, tiers (fake clock)."""

from __future__ import annotations

import pytest

from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.config import MasterConfig
from kvcake.store.errors import (
    InvalidParams,
    NoSpace,
    ObjectAlreadyExists,
    ObjectHasLease,
    ObjectNotFound,
    ReplicaNotReady,
    SegmentAlreadyExists,
)
from kvcake.store.master_state import MasterState
from kvcake.store.metadata import Tier
from kvcake.store.protocol import PutOptions

A, B, W = ClientId("node-a"), ClientId("node-b"), ClientId("writer")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(capacity: int = 1 << 20, segments: int = 2, **kw: object) -> tuple[MasterState, Clock]:
    clock = Clock()
    kw.setdefault("evict_step_ms", 0)  # steps bounded by count only: deterministic on any CPU
    st = MasterState(MasterConfig(lease_ttl_s=10, client_ttl_s=5, **kw), clock)  # type: ignore[arg-type]
    for i, c in enumerate([A, B][:segments]):
        st.mount(c, f"host{i}", SegmentName(f"seg{i}"), capacity)
    return st, clock


def put(st: MasterState, key: str, size: int, **opts: object) -> None:
    st.put_start(W, "hostw", key, size, PutOptions(**opts))  # type: ignore[arg-type]
    st.put_end(W, key)


def test_two_phase_visibility_and_revoke() -> None:
    st, _ = make()
    reps = st.put_start(W, "h", "k", 1000)
    assert len(reps) == 1 and reps[0].size == 1000
    assert not st.exist(W, "k")  # PROCESSING is invisible
    with pytest.raises(ObjectNotFound):
        st.get_replicas(W, "k")
    st.put_end(W, "k")
    size, got = st.get_replicas(W, "k")
    assert size == 1000 and got == reps
    st.put_start(W, "h", "r", 500)
    st.put_revoke(W, "r")
    assert "r" not in st.objects
    with pytest.raises(ObjectNotFound):
        st.put_end(W, "r")
    st.check()


def test_put_never_overwrites_and_concurrent_put_conflicts() -> None:
    st, _ = make()
    put(st, "k", 100)
    with pytest.raises(ObjectAlreadyExists):
        st.put_start(W, "h", "k", 100)
    st.put_start(W, "h", "p", 100)
    with pytest.raises(ObjectAlreadyExists):
        st.put_start(B, "h", "p", 100)
    with pytest.raises(ObjectNotFound):
        st.put_end(B, "p")  # only the writer may finish its put


def test_replicas_on_distinct_segments_best_effort() -> None:
    st, _ = make(segments=2)
    reps = st.put_start(W, "h", "k", 100, PutOptions(replica_num=3))
    assert sorted(r.segment for r in reps) == ["seg0", "seg1"]
    reps = st.put_start(W, "h", "k2", 100, PutOptions(replica_num=2, preferred_segments=["seg1"]))
    assert reps[0].segment == "seg1" and reps[1].segment == "seg0"


def test_preempt_abandoned_put_start_and_reclaim_later() -> None:
    st, clock = make(put_start_timeout_s=1.0, put_start_discard_s=6.0)
    st.put_start(A, "h", "k", 4096)
    clock.t += 1.5
    st.put_start(B, "h", "k", 4096)  # pre-empts A's abandoned put
    with pytest.raises(ObjectNotFound):
        st.put_end(A, "k")
    st.put_end(B, "k")
    used = sum(s.allocator.allocated for s in st.segments.values())
    assert used == 2 * 4096  # the abandoned space is not reused yet (A may still write)
    clock.t += 6.5
    st.maybe_evict()
    assert sum(s.allocator.allocated for s in st.segments.values()) == 4096
    st.check()


def test_a_revoked_or_dead_writers_range_is_not_handed_out_before_its_grace() -> None:
    """A put whose write timed out against a paused node is revoked, but its bytes may still
    sit in the node's sockets and land when it wakes: the range is not given to the next put
    until the writer's grace (max(put_start_discard_s, client_ttl_s)) has passed. The same for
    a writer that expired mid-put (it may wake up and write on)."""
    st, clock = make(capacity=4096, segments=1, put_start_discard_s=3.0)  # client TTL 5 s
    (rep,) = st.put_start(W, "h", "k1", 4096)
    st.put_revoke(W, "k1")
    with pytest.raises(NoSpace):
        st.put_start(B, "h", "k2", 4096)  # before: k2 got k1's range at once
    clock.t += 4.9
    st.maybe_evict()
    with pytest.raises(NoSpace):
        st.put_start(B, "h", "k2", 4096)
    clock.t += 0.2
    st.maybe_evict()
    assert st.put_start(B, "h", "k2", 4096)[0].offset == rep.offset
    st.put_end(B, "k2")
    st.remove("k2", force=True)  # a COMPLETE object's range is free at once: nobody writes it
    (rep,) = st.put_start(W, "h", "k3", 4096)
    clock.t += 6
    st.touch(A, "host0")
    st.touch(B, "h")
    assert st.expire_clients() == [W]
    with pytest.raises(NoSpace):
        st.put_start(B, "h", "k4", 4096)
    clock.t += 5.1
    st.maybe_evict()
    assert st.put_start(B, "h", "k4", 4096)[0].offset == rep.offset
    st.check()


def test_upsert_in_place_and_resize() -> None:
    st, _ = make()
    put(st, "k", 1000)
    (old,) = st.get_replicas(W, "k")[1]
    with pytest.raises(ObjectHasLease):
        st.put_start(W, "h", "k", 1000, upsert=True)
    st.objects["k"].lease_until = 0  # type: ignore[index]
    (same,) = st.put_start(W, "h", "k", 1000, upsert=True)
    assert (same.segment, same.offset) == (old.segment, old.offset)
    st.put_end(W, "k")
    st.objects["k"].lease_until = 0  # type: ignore[index]
    st.put_start(W, "h", "k", 5000, upsert=True)
    st.put_end(W, "k")
    assert st.get_replicas(W, "k")[0] == 5000
    st.check()


def test_leases_block_remove_until_expiry() -> None:
    st, clock = make()
    put(st, "k", 100)
    st.remove("k")  # a fresh put grants no lease
    put(st, "k", 100)
    assert st.exist(W, "k")  # exist grants a lease
    with pytest.raises(ObjectHasLease):
        st.remove("k")
    clock.t += 10.5
    st.remove("k")
    put(st, "k", 100)
    st.get_replicas(W, "k")
    st.remove("k", force=True)
    with pytest.raises(ObjectNotFound):
        st.remove("k")


def test_remove_all_skips_leased_and_regex() -> None:
    st, _ = make()
    for i in range(5):
        put(st, f"a{i}", 100)
    put(st, "b0", 100)
    st.get_replicas(W, "a0")
    assert st.remove_all(pattern="a") == 4  # a prefix
    assert set(st.objects) == {"a0", "b0"}
    put(st, "x/1/y", 100)
    put(st, "x/2/z", 100)
    assert st.remove_all(pattern="x/*/y") == 1  # a glob over the whole key
    assert st.remove_all(pattern="^b") == 0  # not a regex
    assert st.remove_all(regex="^b") == 1  # Mooncake's remove_by_regex
    assert st.remove_all(force=True) == 2
    with pytest.raises(InvalidParams):
        st.remove_all(regex="(")
    with pytest.raises(InvalidParams):
        st.remove_all(pattern="*" * 2000)


def test_eviction_skips_leased_pinned_and_incomplete() -> None:
    st, clock = make(capacity=64 * 1024, segments=1, high_watermark=0.9, eviction_ratio=0.2)
    put(st, "hard", 4096, hard_pin=True)
    put(st, "soft", 4096, soft_pin="enable", soft_pin_ttl_ms=60_000)
    put(st, "leased", 4096)
    st.get_replicas(W, "leased")
    st.put_start(W, "h", "incomplete", 4096)
    for i in range(12):
        put(st, f"o{i}", 4096)
    assert st.used_ratio() == 1.0
    assert st.maybe_evict() > 0
    assert st.used_ratio() <= 0.9
    for key in ("hard", "soft", "leased", "incomplete"):
        assert key in st.objects
    assert "o0" not in st.objects  # least recently used goes first
    # allocation failure with everything else leased: the soft pin yields, then NoSpace
    for key, obj in list(st.objects.items()):
        if key != "soft" and obj.readable():
            st.get_replicas(W, key)
    while st.used_ratio() < 1.0:
        st.put_start(W, "h", f"fill{st.used_ratio()}", 4096)  # incomplete: never evicted
    put(st, "new", 4096)
    assert "soft" not in st.objects
    st.get_replicas(W, "new")
    with pytest.raises(NoSpace):
        put(st, "new2", 4096)
    assert {"hard", "leased", "incomplete"} <= set(st.objects)
    st.check()
    clock.t += 11
    put(st, "after-lease", 4096)  # the lease lapsed: its object could be evicted
    st.check()


def test_eviction_steps_are_time_bounded_but_a_waiting_put_is_not() -> None:
    # A step looks at evict_batch objects at most and stops after evict_step_ms (at least one
    # object per step); a put_start that needs room now runs untimed steps under its lock.
    st, _ = make(capacity=256 * 1024, segments=1, high_watermark=0.5, eviction_ratio=0.5,
                 evict_batch=64, evict_step_ms=1e-6)  # fmt: skip
    for i in range(64):
        put(st, f"o{i}", 4096)
    assert st.maybe_evict() == 4096  # one object: the time bound, not the batch, ended it
    assert len(st.objects) == 63
    st2, _ = make(capacity=256 * 1024, segments=1, high_watermark=1.0, eviction_ratio=0.01,
                  evict_batch=64, evict_step_ms=1e-6)  # fmt: skip
    for i in range(64):
        put(st2, f"o{i}", 4096)
    put(st2, "big", 128 * 1024)  # needs 32 small objects evicted in its put_start
    assert "big" in st2.objects and len(st2.objects) == 64 - 32 + 1
    st.check()
    st2.check()


def test_client_expiry_drops_segments_and_replicas() -> None:
    st, clock = make()
    reps = st.put_start(W, "h", "k", 100, PutOptions(replica_num=2))
    st.put_end(W, "k")
    assert len(reps) == 2
    put(st, "only-a", 100, preferred_segments=["seg0"])
    clock.t += 3
    st.touch(B, "host1")
    st.touch(W, "hostw")
    clock.t += 3
    assert st.expire_clients() == [A]
    assert "seg0" not in st.segments
    assert [r.segment for r in st.get_replicas(W, "k")[1]] == ["seg1"]
    assert "only-a" not in st.objects
    assert st.touch(A, "host0") is False  # a returning client is told to remount
    st.check()


def test_bad_input_is_typed() -> None:
    st, _ = make()
    with pytest.raises(InvalidParams):
        st.put_start(W, "h", "", 10)
    with pytest.raises(InvalidParams):
        st.put_start(W, "h", "k", 0)
    with pytest.raises(InvalidParams):
        st.put_start(W, "h", "k", 10, PutOptions(replica_num=0))
    with pytest.raises(NoSpace):
        st.put_start(W, "h", "k", 1 << 62)
    with pytest.raises(InvalidParams):
        st.mount(A, "h", SegmentName("x"), -1)
    with pytest.raises(SegmentAlreadyExists) as refused:  # Mooncake's -102
        st.mount(B, "h", SegmentName("seg0"), 100)  # someone else's segment name
    assert refused.value.holder is not None and refused.value.holder[0] == A  # (for a successor)
    st.check()


def test_offload_then_serve_from_disk_then_promote() -> None:
    st, clock = make(capacity=16 * 1024, segments=1, promote_after_hits=2, eviction_ratio=0.5)
    st.mount(A, "host0", SegmentName("seg0.ssd"), 1 << 20, Tier.DISK, "host0:9")
    for i in range(4):
        put(st, f"o{i}", 4096)
    assert st.maybe_evict() > 0
    assert st.maybe_evict() == 0  # in-flight offloads count as freed: no second wave
    tasks = st.take_tasks(A)
    assert {t.kind for t in tasks} == {"offload"}
    key = tasks[0].key
    with pytest.raises(ReplicaNotReady):
        st.remove(key)  # being copied
    assert st.get_replicas(W, key)[1][0].tier == "memory"  # still readable meanwhile
    clock.t += 11
    for t in tasks:
        st.task_done(A, "offload", t.key, True)
    reps = st.get_replicas(W, key)[1]
    assert [r.tier for r in reps] == ["disk"] and reps[0].endpoint == "host0:9"
    st.get_replicas(W, key)  # second disk hit -> promotion
    (promo,) = st.take_tasks(A)
    assert promo.kind == "promote" and promo.key == key
    st.task_done(A, "promote", key, True)
    tiers = sorted(r.tier for r in st.get_replicas(W, key)[1])
    assert tiers == ["disk", "memory"]
    st.check()


def test_disk_mount_adopts_verified_copies() -> None:
    st, _ = make()
    put(st, "k", 100)
    copies = [("new", 50), ("k", 99), ("k2", 0), ("old", 50), ("bad", 50)]
    sums = [[1], [2], [], [], [1, 2]]  # "old": a copy written before checksums; "bad": 2 for 50 B
    rejected = st.mount(A, "host0", SegmentName("d"), 1000, Tier.DISK, "h:1", copies, sums)
    assert rejected == ["k", "k2", "old", "bad"]  # size mismatch; invalid size; no/bad sums
    assert st.get_replicas(W, "new")[1][0].tier == "disk"
    assert st.lookup(W, "new")[2] == [1]  # the copy's checksums are the object's


def test_putend_sums_are_judged_key_by_key() -> None:
    """A PutEnd's sums pair with its keys in order; one bad pair fails only its key."""
    from kvcake.store import protocol as P
    from kvcake.store.master_server import MasterHandlers

    st, _ = make()
    handlers = MasterHandlers(st, lambda: "")
    keys = ["good", "two-sums", "not-started", "negative", "also-good"]
    started = [k for k in keys if k != "not-started"]
    handlers.dispatch(P.PutStart(str(W), "hostw", started, [100] * len(started), PutOptions()))
    sums = [[7], [1, 2], [3], [-1], [(1 << 64) - 1]]
    reply = handlers.dispatch(P.PutEnd(str(W), keys, sums=sums))
    codes = [r.code for r in reply.results]
    bad, missing = InvalidParams.default_code, ObjectNotFound.default_code
    assert codes == [0, bad, missing, bad, 0]
    assert st.lookup(W, "good")[2] == [7] and st.lookup(W, "also-good")[2] == [(1 << 64) - 1]
    assert not st.exist(W, "two-sums") and not st.exist(W, "negative")  # their space freed
    st.check()


def test_a_heartbeat_says_whether_the_master_still_has_the_clients_segments() -> None:
    """FORGOTTEN: a client this master never knew or expired (its objects are gone here);
    REMOUNT: one it replayed and waits for (its segments are kept); 0: known."""
    from kvcake.store import protocol as P

    st, clock = make()
    assert st.heard(A, "host0") == 0  # mounted by make()
    st.parts.clients.rejoin.add(B)  # as a replay leaves the clients it restored
    assert st.heard(B, "host1") == P.REMOUNT
    stranger = ClientId("new")
    assert st.heard(stranger, "h") == P.FORGOTTEN and st.heard(stranger, "h") == 0
    clock.t += 100  # A and B fall silent past the TTL and are expired with their segments
    assert A in st.expire_clients()
    assert st.heard(A, "host0") == P.FORGOTTEN
