"""A new leader (or a master restarted from its log) does not hand out a range that a writer
of the old one may still be writing into: a PROCESSING put's, a copy's target, a range waiting
out the writer's grace. Each is logged as a hold (store/ha/view.py) and kept for the writer's
grace from the take-over (docs/store.md, "The writer's grace")."""

from __future__ import annotations

import msgspec
import pytest

from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.config import MasterConfig
from kvcake.store.errors import NoSpace
from kvcake.store.ha.journal import HOLD_WAIT_BYTES, Journal, JournaledState
from kvcake.store.ha.replay import build_state
from kvcake.store.ha.view import (
    ObjGone,
    ObjHeld,
    ObjRec,
    Record,
    SegRec,
    View,
    decode_records,
    decode_snapshot,
    encode_records,
    encode_snapshot,
)
from kvcake.store.metadata import Status
from tests.store.test_master_state import Clock

CAP = 4096
A, B, W = ClientId("node-a"), ClientId("node-b"), ClientId("writer")


def config() -> MasterConfig:
    # writer's grace = max(put_start_discard_s, client_ttl_s) = 5 s
    return MasterConfig(lease_ttl_s=10, client_ttl_s=5, put_start_discard_s=3.0, evict_step_ms=0)


def leader(clock: Clock, segments: int = 1) -> JournaledState:
    st = JournaledState(config(), clock)
    for i, c in enumerate([A, B][:segments]):
        st.mount(c, f"host{i}", SegmentName(f"seg{i}"), CAP)
    return st


def take_over(old: JournaledState, clock: Clock) -> JournaledState:
    with old.lock:
        return replay(old.records(), clock)


def replay(recs: list[Record], clock: Clock) -> JournaledState:
    """What a new leader builds from the old one's records, through the log's wire form and a
    snapshot."""
    recs = decode_records(encode_records(recs))
    view = View()
    view.apply_all(1, recs)
    view = View.of(decode_snapshot(encode_snapshot(view.snapshot())))
    return build_state(config(), view, clock=clock)


def free_of(st: JournaledState, seg: str) -> int:
    return st.parts.segs.segments[SegmentName(seg)].allocator.free


def test_a_put_in_flight_at_the_take_over_keeps_its_range_for_the_grace() -> None:
    clock = Clock()
    old = leader(clock)
    (rep,) = old.put_start(W, "h", "k1", CAP)  # its writer is still copying: no PutEnd
    clock.t += 2
    new = take_over(old, clock)
    assert "k1" not in new.objects  # gone, as in Mooncake: its PutEnd fails, the put retries
    with pytest.raises(NoSpace):
        new.put_start(B, "h", "k2", CAP)  # before holds: k2 got k1's range at once
    clock.t += 4.9  # the grace counts from the take-over, not from the PutStart
    new.maybe_evict()
    assert free_of(new, "seg0") == 0
    clock.t += 0.2
    new.maybe_evict()
    assert new.put_start(B, "h", "k2", CAP)[0].offset == rep.offset
    new.check()


def test_the_new_leader_logs_the_holds_as_its_own_and_their_end() -> None:
    clock = Clock()
    old = leader(clock)
    (rep,) = old.put_start(W, "h", "k1", CAP)
    new = take_over(old, clock)
    with new.lock:
        recs = new.records()
    assert ObjGone("k1") in recs  # the held put is not carried on
    (seg,) = [r for r in recs if isinstance(r, SegRec)]
    assert seg.held == [(rep.offset, CAP)]  # a third leader would hold it too
    clock.t += 5.1
    new.maybe_evict()
    with new.lock:
        (seg,) = [r for r in new.records() if isinstance(r, SegRec)]
    assert seg.held == []


def test_a_revoked_puts_range_in_its_grace_stays_held_on_the_new_leader() -> None:
    clock = Clock()
    old = leader(clock)
    (rep,) = old.put_start(W, "h", "k1", CAP)
    old.put_revoke(W, "k1")  # its bytes may still sit in a paused node's sockets
    new = take_over(old, clock)
    with pytest.raises(NoSpace):
        new.put_start(B, "h", "k2", CAP)
    clock.t += 5.1
    new.maybe_evict()
    assert new.put_start(B, "h", "k2", CAP)[0].offset == rep.offset


def test_a_copys_target_stays_held_and_its_object_stays_readable() -> None:
    clock = Clock()
    old = leader(clock)
    old.put_start(W, "h", "k1", CAP)
    old.put_end(W, "k1", [7])
    old.mount(B, "host1", SegmentName("seg1"), CAP)
    (target,) = old.copy_start(W, "k1", ["seg1"])
    new = take_over(old, clock)
    obj = new.objects["k1"]  # type: ignore[index]
    assert obj.status is Status.COMPLETE and [r.segment for r in obj.replicas] == ["seg0"]
    assert free_of(new, "seg1") == 0  # the copier may still be writing the target
    clock.t += 5.1
    new.maybe_evict()
    assert free_of(new, "seg1") == CAP
    assert target.segment == "seg1"


def test_completed_puts_hold_nothing() -> None:
    clock = Clock()
    old = leader(clock)
    old.put_start(W, "h", "k1", CAP // 2)
    old.put_end(W, "k1", [1])
    with old.lock:
        recs = old.records()
    assert [r for r in recs if isinstance(r, ObjHeld)] == []
    (rec,) = [r for r in recs if isinstance(r, ObjRec)]
    assert rec.held == []
    new = replay(recs, clock)
    assert free_of(new, "seg0") == CAP // 2  # at once: no writer is left


def test_a_put_start_waits_for_its_holds_only_when_large() -> None:
    j = Journal()
    j.writing("small", HOLD_WAIT_BYTES - 1)
    assert j.take_changed() is False  # logged with the next commit; the reply does not wait
    j.writing("a", HOLD_WAIT_BYTES // 2)
    j.writing("b", HOLD_WAIT_BYTES // 2)
    assert j.take_changed() is True  # a batch counts in all
    assert j.take_changed() is False
    j.object("k")
    assert j.take_changed() is True
    assert list(j.dirty) == [("o", "small"), ("o", "a"), ("o", "b"), ("o", "k")]


def test_records_from_before_holds_still_decode() -> None:
    old_obj = msgspec.msgpack.encode([["obj", "k", 10, False, [["s", 0, "memory"]], "", [3]]])
    old_seg = msgspec.msgpack.encode([["seg", "s", "c", "h", "memory", 64, "", ""]])
    (obj,) = decode_records(old_obj)
    (seg,) = decode_records(old_seg)
    assert isinstance(obj, ObjRec) and obj.held == [] and obj.sums == [3]
    assert isinstance(seg, SegRec) and seg.held == []


def test_a_hold_the_log_cannot_place_is_skipped_and_the_object_kept() -> None:
    view = View()
    view.apply(SegRec("seg0", "node-a", "host0", "memory", CAP))
    view.apply(ObjRec("k", 1000, False, [("seg0", 1024, "memory")], sums=[1]))
    view.apply(ObjHeld("over", [("seg0", 1024 + 64, 128)]))  # inside k's range: a lying log
    view.apply(ObjHeld("fine", [("seg0", 0, 1000)]))
    view.apply(ObjHeld("gone", [("nowhere", 0, 64)]))
    st = build_state(config(), view, clock=Clock())
    assert "k" in st.objects
    assert free_of(st, "seg0") == CAP - 1024 - 1024  # k and "fine", not "over"
