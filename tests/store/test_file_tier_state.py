"""The file tier's bookkeeping in the master's state machine (fake clock, no I/O): a file
replica per put, readable only once its writer reports, eviction keeping it, removal queueing
the unlink, ranges held until the file is gone, writers that vanish, and the HA replay."""

from __future__ import annotations

import pytest

from kvcake.core.ids import ClientId, ObjectKey, SegmentName
from kvcake.core.integrity import chunk_count
from kvcake.store.config import MasterConfig
from kvcake.store.errors import InvalidParams, ObjectHasLease
from kvcake.store.filetier import FILE_SEGMENT, file_path
from kvcake.store.ha.journal import JournaledState
from kvcake.store.ha.replay import build_state
from kvcake.store.ha.view import View
from kvcake.store.master_state import MasterState
from kvcake.store.metadata import Tier
from kvcake.store.protocol import PutOptions
from tests.store.test_master_state import Clock

NODE, W = ClientId("node"), ClientId("writer")
OBJ = 4096
DIR = "/shared/kvcake"


def make(state: type[MasterState] = MasterState, quota: int = 1 << 20) -> tuple[MasterState, Clock]:
    clock = Clock()
    cfg = MasterConfig(lease_ttl_s=1, client_ttl_s=60, high_watermark=0.5, eviction_ratio=0.25)
    st = state(cfg, clock)
    st.mount(NODE, "h", SegmentName("mem"), 4 * OBJ)
    st.mount_file_tier(DIR, quota)
    return st, clock


def put(st: MasterState, key: str, report: bool = True) -> int:
    """A whole put; returns the offset of its file replica."""
    descs = st.put_start(W, "hw", key, OBJ)
    assert [d.tier for d in descs] == ["memory", "file"]
    assert descs[1].endpoint == file_path(DIR, descs[1].offset)
    st.put_end(W, key, [7] * chunk_count(OBJ))  # any well-formed sums: never read here
    if report:
        st.task_done(W, "persist", key, True, descs[1].offset)
    return descs[1].offset


def tiers(st: MasterState, key: str) -> list[str]:
    return sorted(r.tier.value for r in st.objects[ObjectKey(key)].replicas if r.complete)


def test_file_replica_is_readable_once_written_and_survives_eviction() -> None:
    st, clock = make()
    off = put(st, "a", report=False)
    assert tiers(st, "a") == ["memory"]  # not readable before its writer reports
    clock.t += 2
    while st.maybe_evict():
        pass
    assert tiers(st, "a") == ["memory"]  # memory kept while the file is being written
    st.task_done(W, "persist", "a", True, off)
    for k in ("b", "c"):
        put(st, k)
    clock.t += 2
    while st.maybe_evict():
        pass
    assert tiers(st, "a") == ["file"]  # memory freed, the file copy stays
    size, reps = st.get_replicas(W, "a")
    assert size == OBJ and [(r.tier, r.endpoint) for r in reps] == [("file", file_path(DIR, off))]
    for _ in range(5):  # the file tier is read in place, never promoted
        st.get_replicas(W, "a")
    assert not st.objects[ObjectKey("a")].copying
    st.check()


def test_an_owner_with_an_ssd_tier_gets_its_evicted_objects_though_the_file_has_them() -> None:
    """Mooncake's client offloads an evicted object to its local storage although root_fs_dir
    has it too (LOCAL_DISK and DISK replicas; its promotion-on-hit starts from the former)."""
    st, clock = make()
    st.mount(NODE, "h", SegmentName("mem.ssd"), 4 * OBJ, Tier.DISK, "h:9")
    for k in ("a", "b", "c"):
        put(st, k)
    clock.t += 2
    while st.maybe_evict():
        pass
    offloads = [t.key for t in st.take_tasks(NODE) if t.kind == "offload"]
    assert offloads, "no offload to the SSD tier"
    assert tiers(st, offloads[0]) == ["file", "memory"]  # memory kept until the copy is done
    for k in offloads:
        st.task_done(NODE, "offload", k, True)
    assert tiers(st, offloads[0]) == ["disk", "file"]
    st.check()


def test_remove_queues_the_unlink_and_holds_the_range_until_reaped() -> None:
    st, _ = make()
    off = put(st, "a")
    seg = st.segments[FILE_SEGMENT]
    used = seg.allocator.allocated
    st.remove("a")
    assert st.file_unlinks == [off] and seg.allocator.allocated == used
    gone: list[str] = []
    assert st.reap_files(unlink=gone.append) == 1
    assert gone == [file_path(DIR, off)] and seg.allocator.allocated == 0
    st.check()


def test_a_file_dropped_while_being_written_waits_for_its_writer() -> None:
    st, _ = make()
    off = put(st, "a", report=False)
    st.remove("a")  # allowed (as in Mooncake); the writer may still rename its file
    assert st.file_unlinks == [] and off in st.file_orphans
    off2 = put(st, "a", report=False)  # a new put of the key never gets the held name
    assert off2 != off
    st.task_done(W, "persist", "a", True, off)  # the late report of the first write
    assert st.file_unlinks == [off] and tiers(st, "a") == ["memory"]
    st.task_done(W, "persist", "a", True, off2)
    assert tiers(st, "a") == ["file", "memory"]
    st.check()


def test_failed_unknown_and_abandoned_writes() -> None:
    st, clock = make()
    off = put(st, "a", report=False)
    st.task_done(W, "persist", "a", True, off + 64)  # unknown offset: ignored
    st.task_done(ClientId("other"), "persist", "a", True, off)  # not its writer: ignored
    assert tiers(st, "a") == ["memory"]
    st.task_done(W, "persist", "a", False, off)  # failed: the replica goes, its file too
    assert tiers(st, "a") == ["memory"] and st.file_unlinks == [off] and st.file_failed == 1
    off_b = put(st, "b", report=False)
    clock.t += st.cfg.put_start_timeout_s + st.cfg.put_start_discard_s + 1
    st.sweep_processing()  # a writer silent that long is given up
    assert off_b in st.file_unlinks and not st.file_writes
    off_c = put(st, "c", report=False)
    clock.t += st.cfg.client_ttl_s + 1
    st.expire_clients()  # the writer is gone (client_ttl_s): its writes are given up
    assert off_c in st.file_unlinks


def test_upsert_in_place_replaces_the_file_and_leases_protect_it() -> None:
    st, clock = make()
    off = put(st, "a")
    st.get_replicas(W, "a")
    with pytest.raises(ObjectHasLease):
        st.put_start(W, "hw", "a", OBJ, upsert=True)
    clock.t += 2
    descs = st.put_start(W, "hw", "a", OBJ, upsert=True)
    assert descs[-1].tier == "file" and descs[-1].offset != off
    assert st.file_unlinks == [off]
    st.check()


def test_full_quota_and_reserved_name() -> None:
    st, _ = make(quota=OBJ)
    put(st, "a")
    descs = st.put_start(W, "hw", "b", OBJ, PutOptions())
    assert [d.tier for d in descs] == ["memory"] and st.file_full == 1  # no room: memory only
    with pytest.raises(InvalidParams):
        st.mount(NODE, "h", FILE_SEGMENT, OBJ)


def test_journal_records_the_file_tier_and_replay_restores_it() -> None:
    st, _ = make(JournaledState)
    assert isinstance(st, JournaledState)
    off = put(st, "a")
    view = View()
    for rec in st.records():
        view.apply(rec)
    assert view.segments[FILE_SEGMENT].tier == "file"
    assert (FILE_SEGMENT, off, "file") in view.objects["a"].replicas
    again = build_state(st.cfg, view)
    assert ClientId("@files") not in again.clients  # never expired like a node
    rep = next(r for r in again.objects[ObjectKey("a")].replicas if r.tier is Tier.FILE)
    assert rep.offset == off and rep.complete
    again.mount_file_tier(DIR, 1 << 20)  # the restarted master mounts it again: kept
    assert (
        again.segments[FILE_SEGMENT].allocator.allocated
        == st.segments[FILE_SEGMENT].allocator.allocated
    )
    again.check()
