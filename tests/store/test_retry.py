"""Retry safety of the master RPC (issue 11 §1): duplicated and reordered requests are applied
once (hypothesis, against MasterState through the handlers), unfinished puts are swept, dead
owners' segments are released, and a real master stalled past the client's timeout (SIGSTOP)
does not turn a retried put into a conflict."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcake.core.ids import ClientId, SegmentName
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.config import MasterConfig
from kvcake.store.dedup import DedupTable
from kvcake.store.errors import INVALID_PARAMS, NoSpace
from kvcake.store.fences import Fences
from kvcake.store.master_server import MasterHandlers
from kvcake.store.master_state import MasterState
from kvcake.store.metadata import Status
from kvcake.store.owners import ReleasingBackend, Successors, pid_of, process_gone, process_of
from kvcake.transfer.errors import SegmentExists
from kvcake.transfer.metadata import SegEntry
from kvcake.transfer.registry import host_identity
from tests.store.conftest import Factory
from tests.store.test_master_state import Clock

KEYS = ["k0", "k1", "k2"]
CLIENTS = ["c0", "c1"]


def _fresh() -> tuple[MasterState, MasterHandlers]:
    clock = Clock()
    state = MasterState(MasterConfig(seed=7), clock)
    state.parts.segs.fences = Fences(base=1)  # (the clock's: runs compared must agree)
    state.mount(ClientId("node"), "h", SegmentName("seg"), 1 << 16)
    return state, MasterHandlers(state, lambda: "")


def _msg(op: str, client: str, key: str) -> P.Request:
    if op == "start":
        return P.PutStart(client, "h", [key], [100 + len(key)])
    if op == "end":
        return P.PutEnd(client, [key])
    if op == "revoke":
        return P.PutRevoke(client, [key])
    if op == "remove":
        return P.Remove(client, [key])
    return P.RemoveAll(client)


def _view(state: MasterState) -> object:
    objs = {
        k: (o.status.value, o.size, o.writer, [(r.segment, r.offset) for r in o.replicas])
        for k, o in state.objects.items()
    }
    return objs, {n: s.allocator.allocated for n, s in state.segments.items()}


ops = st.lists(
    st.tuples(
        st.sampled_from(["start", "start", "end", "end", "revoke", "remove", "removeall"]),
        st.sampled_from(CLIENTS),
        st.sampled_from(KEYS),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, dups=st.lists(st.tuples(st.integers(0, 24), st.integers(0, 30)), max_size=20))
def test_duplicated_and_reordered_requests_apply_once(
    ops: list[tuple[str, str, str]], dups: list[tuple[int, int]]
) -> None:
    """Each client sends its requests one at a time (seq +1, ack = last answered); the two
    clients interleave as drawn. A duplicate of request i (a retry, or the original that sat in
    a stalled master's socket) may arrive any time after it. The state and every first reply
    must equal a run without duplicates; a duplicate gets the first reply or a stale refusal."""
    ref_state, ref = _fresh()
    got_state, got = _fresh()
    seqs = dict.fromkeys(CLIENTS, 0)
    sent: list[P.Request] = []
    ref_replies: list[P.Reply] = []
    for op, client, key in ops:
        seqs[client] += 1
        m = _msg(op, client, key)
        m.rid = P.ReqId(f"s-{client}", seqs[client], seqs[client] - 1)  # type: ignore[union-attr]
        sent.append(m)
        ref_replies.append(ref.dispatch(_msg(op, client, key)))  # no rid: plain
    # Delivery order: every request once in order, duplicates of i inserted after position i.
    late: dict[int, list[int]] = {}
    for i, after in dups:
        if i < len(sent):
            late.setdefault(max(i, min(after, len(sent) - 1)), []).append(i)
    for pos, m in enumerate(sent):
        assert got.dispatch(m) == ref_replies[pos]
        for i in late.get(pos, []):
            again = got.dispatch(sent[i])
            assert again == ref_replies[i] or (
                again.code == INVALID_PARAMS and "stale" in again.message
            )
    assert _view(got_state) == _view(ref_state)
    got_state.check()


def test_dedup_table_is_bounded() -> None:
    t: DedupTable[str] = DedupTable(max_sessions=3, max_pending=2)
    for s in range(5):
        assert t.lookup("c", f"s{s}", 1, 0) is None
        t.record("c", f"s{s}", 1, "r")
    assert t.sessions == 3
    for seq in (2, 3, 4):
        t.lookup("c", "s4", seq, 0)
        t.record("c", "s4", seq, f"r{seq}")
    assert len(t) <= 3 * 2
    assert t.lookup("c", "s4", 4, 0) == "r4"
    assert t.lookup("c", "s4", 5, 4) is None and len(t) <= 3 * 2  # acked replies pruned
    t.forget_client("c")
    assert t.sessions == 0


def test_sweep_unfinished_puts_and_dead_writers() -> None:
    clock = Clock()
    cfg = MasterConfig(put_start_timeout_s=1, put_start_discard_s=1, client_ttl_s=5)
    state = MasterState(cfg, clock)
    state.mount(ClientId("node"), "h", SegmentName("seg"), 1 << 16)
    state.put_start(ClientId("slow"), "h", "old", 1000)
    clock.t += 1.5
    state.put_start(ClientId("slow"), "h", "young", 1000)
    assert state.sweep_processing() == 0
    clock.t += 0.6  # "old" is 2.1 s old > 1 + 1
    assert state.sweep_processing() == 1
    assert "old" not in state.objects and state.objects["young"].status is Status.PROCESSING
    # The writer dies (silent past its TTL) while the node keeps heartbeating.
    clock.t += 5.1
    state.touch(ClientId("node"), "h")
    assert state.expire_clients() == [ClientId("slow")]
    assert not state.objects and not state.processing
    # A dead writer may wake and write on: its ranges come back after the writer's grace
    # (max(put_start_discard_s, client_ttl_s) = 5 s), not at once.
    seg = state.segments[SegmentName("seg")]
    assert seg.allocator.allocated > 0
    clock.t += 5.1
    state.maybe_evict()
    assert seg.allocator.allocated == 0
    state.check()


def test_put_without_segments_says_so() -> None:
    state = MasterState(MasterConfig())
    try:
        state.put_start(ClientId("w"), "h", "k", 10)
    except NoSpace as exc:
        assert "no memory segment is mounted" in str(exc)
    else:
        raise AssertionError("expected NoSpace")


def test_dead_owner_released_live_owner_kept() -> None:
    """A SIGKILLed owner's name is released to its successor; a live owner's never is."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = host_identity()
    dead_owner, live_owner = f"h/{dead.pid}/aa", f"h/{os.getpid()}/bb"
    assert pid_of(dead_owner) == dead.pid and process_gone(dead_owner, here)
    assert not process_gone(live_owner, here) and not process_gone(dead_owner, "other-host")
    backend = ReleasingBackend(process_gone)
    entry = lambda owner: SegEntry("kv/decode-0", owner, "h", here, 10, [])  # noqa: E731
    backend.put(entry(dead_owner))
    backend.put(entry(live_owner))  # successor takes the name
    assert backend.get("kv/decode-0").owner == live_owner  # type: ignore[union-attr]
    try:
        backend.put(entry("h/1/cc"))
    except SegmentExists as exc:
        assert "already owned" in str(exc)
    else:
        raise AssertionError("a live owner's segment was taken")
    # Master side: remount of a store segment held by a gone client.
    clock = Clock()
    state = MasterState(
        MasterConfig(client_ttl_s=5), clock, owner_dead=lambda c, s: c == ClientId(dead_owner)
    )
    state.mount(ClientId(dead_owner), "h", SegmentName("seg"), 1 << 16)
    state.put_start(ClientId(dead_owner), "h", "k", 10)
    state.mount(ClientId(live_owner), "h", SegmentName("seg"), 1 << 16)
    assert state.segments[SegmentName("seg")].client == live_owner and not state.objects
    state.mount(ClientId("h/1/cc"), "h", SegmentName("seg2"), 1 << 16)
    clock.t += 6  # its lease expired: released even if its pid looks alive
    state.touch(ClientId(live_owner), "h")
    state.mount(ClientId(live_owner), "h", SegmentName("seg2"), 1 << 16)
    try:
        state.mount(ClientId("h/1/dd"), "h", SegmentName("seg2"), 1 << 16)
    except Exception as exc:
        assert "alive" in str(exc)
    else:
        raise AssertionError("a live client's segment was taken")


def test_a_process_lease_covers_its_other_engines() -> None:
    """On another host no pid can be checked: the instance's KV-segment engine shares its
    ``host/pid/`` with its store client, whose expired lease drops both (and nothing else)."""
    assert process_of("10.0.0.3/612/ab") == "10.0.0.3/612/"
    assert process_of("garbage") is None and process_of("h/x/y") is None
    backend = ReleasingBackend(lambda o, h: False)
    for name, owner in (("kv/decode-0", "10.0.0.3/612/kv"), ("kv/x", "10.0.0.3/6120/kv"),
                        ("store", "10.0.0.3/612/st"), ("other", "10.0.0.4/612/kv")):  # fmt: skip
        backend.put(SegEntry(name, owner, "10.0.0.3", "host-b", 10, []))
    assert backend.delete_process("10.0.0.3/612/") == 2
    assert sorted(e.name for e in backend.list()) == ["kv/x", "other"]


def test_put_survives_master_stalled_past_client_timeout(procs: Factory) -> None:
    """SIGSTOP the real master for longer than the client's RPC timeout in the middle of a put:
    the retried PutStart/PutEnd must be deduplicated (before: -705 for its own put and the
    object left PROCESSING for 30 s)."""
    master = procs("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "10")
    rpc = master.info["rpc"]
    procs("store-server", "--master", rpc, "--segment-size", "8MiB")
    with Client(master=rpc, rpc_timeout_s=0.4, rpc_retries=3) as c:
        c.put("warm", b"w" * 100)
        for i in range(3):
            value = bytes([i]) * 4096
            stop_at = threading.Timer(0.0, master.popen.send_signal, (signal.SIGSTOP,))
            stop_at.start()
            stop_at.join()
            threading.Timer(0.7, master.popen.send_signal, (signal.SIGCONT,)).start()
            t0 = time.monotonic()
            c.put(f"k{i}", value)  # the first attempts time out; a later one is answered
            assert time.monotonic() - t0 >= 0.4
            assert c.get(f"k{i}") == value
        assert c.remove_all(force=True) == 4  # nothing left PROCESSING, nothing applied twice


def test_sigkilled_node_restarts_under_its_name(procs: Factory) -> None:
    """issue 12: a storage node SIGKILLed and restarted at once with the same segment name
    (well inside the client TTL) gets its name back instead of 'already owned'."""
    master = procs("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "30")
    rpc = master.info["rpc"]
    node = procs("store-server", "--master", rpc, "--segment-size", "4MiB", "--name", "node-a")
    with Client(master=rpc) as c:
        c.put("before", b"x" * 1000)
        node.stop(signal.SIGKILL)
        procs("store-server", "--master", rpc, "--segment-size", "4MiB", "--name", "node-a")
        assert not c.is_exist("before")  # the dead node's objects went with its segment
        c.put("after", b"y" * 1000)
        assert c.get_replica_desc("after").replicas[0].segment == "node-a"


def test_node_restarted_while_its_predecessor_is_paused_waits_for_its_lease(
    procs: Factory,
) -> None:
    """A paused predecessor is alive (its pid exists): its name is not taken from it. The new
    node waits (--name-wait-s) until the master expired the silent predecessor, then mounts;
    with no wait it is refused with Mooncake's SEGMENT_ALREADY_EXISTS message."""
    # A lease long enough that both starts below begin inside it on a loaded machine.
    master = procs("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "15")
    rpc = master.info["rpc"]
    flags = ("--master", rpc, "--segment-size", "4MiB", "--name", "node-a", "--http-port", "-1")
    old = procs("store-server", *flags)
    old.popen.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="which is alive|already owned"):
            procs("store-server", *flags, "--name-wait-s", "0")
        new = procs("store-server", *flags, "--name-wait-s", "30")
        waited = time.monotonic() - t0
        assert 13.0 < waited < 45, waited  # until the predecessor's 15 s lease ran out
        assert any("waiting for its lease" in line for line in new.lines), new.lines
        with Client(master=rpc) as c:
            c.put("after", b"y" * 1000)
            assert c.get_replica_desc("after").replicas[0].segment == "node-a"
    finally:
        old.popen.send_signal(signal.SIGCONT)


def test_successors_believe_only_reports_about_their_own_host() -> None:
    """P.OwnerGone is believed only about an owner the master knows ran on the reporter's
    host, and never about the reporter's own process."""
    known = {"10.0.0.5/41/aa": "host-b"}
    s = Successors(known.get, bound=2)
    assert not s.report("10.0.0.5/77/bb", "host-c", "10.0.0.5/41/aa")  # another host's
    assert not s.report("10.0.0.5/77/bb", "host-b", "10.0.0.9/50/cc")  # nowhere known
    assert not s.report("10.0.0.5/41/bb", "host-b", "10.0.0.5/41/aa")  # its own process
    assert not s.report("10.0.0.5/77/bb", "", "10.0.0.5/41/aa")
    assert "10.0.0.5/41/aa" not in s
    assert s.report("10.0.0.5/77/bb", "host-b", "10.0.0.5/41/aa")
    assert "10.0.0.5/41/aa" in s
    known.update({"h/1/x": "host-b", "h/2/x": "host-b"})
    assert s.report("r/9/z", "host-b", "h/1/x") and s.report("r/9/z", "host-b", "h/2/x")
    assert "10.0.0.5/41/aa" not in s and "h/2/x" in s  # bounded: the oldest went first


def test_node_killed_before_it_rejoined_a_restarted_master(procs: Factory, tmp_path) -> None:
    """A master restarted from its state dir knows node-a's segment but not yet where node-a
    runs (node-a is paused, so it has not re-published). node-a is then SIGKILLed and restarted:
    the master tells from the segment record's host and pid that the holder is gone, and the
    new node mounts at once instead of being refused until the 30 s client TTL."""
    state = ("--state-dir", str(tmp_path / "state"), "--client-ttl-s", "30")
    master = procs("master", "--port", "0", "--http-port", "-1", *state)
    rpc = master.info["rpc"]
    node = procs("store-server", "--master", rpc, "--segment-size", "4MiB", "--name", "node-a")
    node.popen.send_signal(signal.SIGSTOP)
    master.stop(signal.SIGKILL)
    port = rpc.rsplit(":", 1)[1]
    procs("master", "--port", port, "--http-port", "-1", *state)
    node.stop(signal.SIGKILL)
    t0 = time.monotonic()
    procs("store-server", "--master", rpc, "--segment-size", "4MiB", "--name", "node-a")
    assert time.monotonic() - t0 < 15
    with Client(master=rpc) as c:
        c.put("after", b"y" * 1000)
        assert c.get_replica_desc("after").replicas[0].segment == "node-a"
