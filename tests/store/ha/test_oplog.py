"""The operation log and replay against real files and a real etcd (no master processes)."""

from __future__ import annotations

import threading
import time

import pytest

from kvcake.core.errors import ConfigError
from kvcake.core.ids import ClientId
from kvcake.store.config import MasterConfig
from kvcake.store.errors import RpcFailed
from kvcake.store.ha.config import HaConfig
from kvcake.store.ha.election import Election
from kvcake.store.ha.etcd import Etcd, EtcdError, b64
from kvcake.store.ha.etcdlog import EtcdOpLog, cluster_prefix
from kvcake.store.ha.filelog import FileOpLog
from kvcake.store.ha.oplog import LogFailed
from kvcake.store.ha.replay import build_state
from kvcake.store.ha.resolve import parse_etcd_address
from kvcake.store.ha.view import ObjGone, ObjRec, SegRec, View
from tests.store.ha.conftest import EtcdServer

SEG = SegRec("seg-a", "node/1/x", "127.0.0.1", "memory", 1 << 20)


def _objs(n: int, start: int = 0) -> list[ObjRec]:
    return [
        ObjRec(f"k{i}", 100, False, [("seg-a", i * 128, "memory")], sums=[i])
        for i in range(start, n)
    ]


def test_replay_rebuilds_allocations_and_drops_lies() -> None:
    view = View()
    for rec in [SEG, *_objs(50)]:
        view.apply(rec)
    view.apply(ObjRec("overlap", 100, True, [("seg-a", 128 * 3 + 64, "memory")], sums=[1]))
    view.apply(ObjRec("nowhere", 100, False, [("seg-b", 0, "memory")], sums=[1]))
    view.apply(ObjGone("k7"))
    # Logged before checksums existed (an old record form, no sums): discarded, not served
    view.apply(ObjRec("legacy", 100, False, [("seg-a", 60 * 128, "memory")]))
    state = build_state(MasterConfig(http_port=-1), view)
    state.check()
    assert set(state.objects) == {f"k{i}" for i in range(50) if i != 7}
    assert state.lookup(ClientId("r"), "k3")[2] == [3]  # checksums survive the replay
    seg = state.segments["seg-a"]
    assert seg.allocator.allocated == 49 * 128
    # New allocations land only in free space: the gap of k7 first (first fit).
    assert seg.allocator.allocate(100) == 7 * 128
    assert state.touch(seg.client, "127.0.0.1") is False  # asked to remount once
    state.check()


def test_file_log_survives_a_torn_tail(tmp_path: pytest.TempPathFactory) -> None:
    log = FileOpLog(tmp_path)  # type: ignore[arg-type]
    assert not log.load().objects
    log.wait(log.append([SEG, *_objs(10)]))
    log.wait(log.append([ObjGone("k3")]))
    log.close()
    with open(tmp_path / "oplog", "ab") as fh:  # type: ignore[operator]
        fh.write(b"\x40\x00\x00\x00garbage-from-a-crash")
    log2 = FileOpLog(tmp_path)  # type: ignore[arg-type]
    view = log2.load()
    assert set(view.objects) == {f"k{i}" for i in range(10)} - {"k3"}
    log2.wait(log2.append(_objs(12, 10)))  # appends after the dropped tail
    log2.close()
    log3 = FileOpLog(tmp_path)  # type: ignore[arg-type]
    assert len(log3.load().objects) == 11
    log3.close()


def test_file_snapshot_compacts(tmp_path: pytest.TempPathFactory) -> None:
    log = FileOpLog(tmp_path, snapshot_every=100)  # type: ignore[arg-type]
    log.load()
    log.wait(log.append([SEG]))
    for i in range(0, 300, 10):
        log.wait(log.append(_objs(i + 10, i)))
    log.close()
    assert (tmp_path / "snapshot").exists()  # type: ignore[operator]
    assert (tmp_path / "oplog").stat().st_size < 100 * 30  # type: ignore[operator]
    log2 = FileOpLog(tmp_path)  # type: ignore[arg-type]
    assert len(log2.load().objects) == 300
    log2.close()


def test_a_log_of_large_records_is_snapshotted_by_its_bytes(
    tmp_path: pytest.TempPathFactory,
) -> None:
    """Few records, each large (a segment re-logged with thousands of held ranges while its
    puts kept failing: the nemesis's 7 s take-over): the log is snapshotted by bytes, not only
    every ``snapshot_every`` records, so what a take-over reads stays bounded; the view is the
    same either way, and a reload counts what it read towards the next snapshot."""
    held = [(i * 4096, 4096) for i in range(3000)]  # ~18 KB a record
    big = [SegRec("seg", "c", "h", "memory", 1 << 30, held=held[: 2000 + i]) for i in range(40)]
    log = FileOpLog(tmp_path, snapshot_every=20_000)  # type: ignore[arg-type]
    log.snapshot_bytes = 128 << 10
    log.load()
    for rec in big:
        log.wait(log.append([rec]))
    log.close()
    assert (tmp_path / "snapshot").exists()  # type: ignore[operator]
    assert (tmp_path / "oplog").stat().st_size < 2 * (128 << 10)  # type: ignore[operator]
    size = (tmp_path / "oplog").stat().st_size  # type: ignore[operator]
    again = FileOpLog(tmp_path)  # type: ignore[arg-type]
    assert again.load().segments["seg"].held == big[-1].held
    assert again._since_bytes == size
    again.close()
    unbounded = FileOpLog(tmp_path / "b", snapshot_every=20_000)  # type: ignore[operator]
    unbounded.snapshot_bytes = 1 << 40
    unbounded.load()
    for rec in big:
        unbounded.wait(unbounded.append([rec]))
    unbounded.close()
    assert not (tmp_path / "b" / "snapshot").exists()  # type: ignore[operator]
    assert (tmp_path / "b" / "oplog").stat().st_size > 4 * (128 << 10)  # type: ignore[operator]


def _leader(etcd: EtcdServer, cluster: str, name: str) -> tuple[Etcd, Election]:
    client = Etcd(etcd.url)
    election = Election(client, cluster, name, ttl_s=2)
    assert election.campaign(threading.Event())
    return client, election


def test_etcd_group_commit_fencing_and_replay(etcd: EtcdServer) -> None:
    client, first = _leader(etcd, "t-fence", "first")
    log = EtcdOpLog(client, "t-fence", first.revision)
    log.load()
    log.wait(log.append([SEG]))

    def worker(w: int) -> None:
        for i in range(25):
            log.wait(log.append(_objs(w * 100 + i + 1, w * 100 + i)))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = client.get_prefix(cluster_prefix("t-fence") + b"log/")
    assert len(entries) < 1 + 200  # several records per etcd transaction
    # The lease ends (as if the first leader hung); a second master takes over.
    client.revoke(first.lease)
    other, second = _leader(etcd, "t-fence", "second")
    with pytest.raises(LogFailed, match="fenced"):
        log.wait(log.append([ObjGone("k0")]))
    with pytest.raises(LogFailed):
        log.append([ObjGone("k1")])  # a failed log stays failed
    log.close()
    log2 = EtcdOpLog(other, "t-fence", second.revision, snapshot_every=100)
    view = log2.load()
    assert len(view.objects) == 200 and "k0" in view.objects
    log2.wait(log2.append(_objs(1100, 1000)))  # crosses snapshot_every: snapshot + compaction
    log2.close()
    assert other.get(cluster_prefix("t-fence") + b"snap/meta") is not None
    # The snapshot compacted etcd's history: old versions of the log are gone from etcd too.
    with pytest.raises(EtcdError, match="compacted"):
        other.post("/v3/kv/range", {"key": b64(cluster_prefix("t-fence")), "revision": "2"})
    assert other.compact(2) is False  # already compacted past it: not an error
    log3 = EtcdOpLog(other, "t-fence", second.revision)
    assert len(log3.load().objects) == 300
    log3.close()
    second.resign()
    first.resign()
    client.close()
    other.close()


class _NoCompaction(Etcd):
    """etcd refusing compaction (an old server, a permission): only space is at stake."""

    def compact(self, revision: int) -> bool:
        raise EtcdError("etcd /v3/kv/compaction: HTTP 403")


def test_a_failed_compaction_costs_no_snapshot_and_no_write(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    base, election = _leader(etcd, "t-nocompact", "first")
    client = _NoCompaction(etcd.url)
    log = EtcdOpLog(client, "t-nocompact", election.revision, snapshot_every=100)
    log.load()
    log.wait(log.append([SEG]))
    log.wait(log.append(_objs(150)))  # crosses snapshot_every: snapshot, then compaction fails
    log.wait(log.append(_objs(160, 150)), timeout_s=10)  # the log goes on
    log.close()
    assert "etcd compaction at revision" in caplog.text  # a warning, not a failed snapshot
    assert "snapshot failed" not in caplog.text
    assert base.get(cluster_prefix("t-nocompact") + b"snap/meta") is not None
    log2 = EtcdOpLog(base, "t-nocompact", election.revision)
    assert len(log2.load().objects) == 160
    log2.close()
    election.resign()
    base.close()
    client.close()


def test_bad_addresses_and_settings() -> None:
    assert parse_etcd_address("etcd://127.0.0.1:2379") == ("127.0.0.1:2379", "kvcake")
    assert parse_etcd_address("etcd://a:1,b:2/pool") == ("a:1,b:2", "pool")
    for bad in ("127.0.0.1:2379", "etcd://", "etcd:///x"):
        with pytest.raises(RpcFailed):
            parse_etcd_address(bad)
    with pytest.raises(ConfigError):
        HaConfig(cluster="has space")
    with pytest.raises(ConfigError):
        HaConfig(etcd_endpoints="http://127.0.0.1:1", state_dir="/tmp/x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        HaConfig(ha_lease_ttl_s=1)
    for bad_delay in (-1, 100_001):
        with pytest.raises(ConfigError, match="commit_delay_us"):
            HaConfig(commit_delay_us=bad_delay)
    with pytest.raises(ConfigError, match="commit_siblings"):
        HaConfig(commit_siblings=0)


def test_slow_take_over_does_not_expire_replayed_nodes(tmp_path: pytest.TempPathFactory) -> None:
    """The replayed owners' client TTL runs from when the new master serves, not from when
    its state was built (a take-over slower than the TTL used to drop every node)."""
    from kvcake.store.ha.durable import DurableMaster

    log = FileOpLog(tmp_path)  # type: ignore[arg-type]
    log.load()
    log.wait(log.append([SEG, *_objs(5)]))
    log.close()
    log = FileOpLog(tmp_path)  # type: ignore[arg-type]
    cfg = MasterConfig(port=0, http_port=-1, directory_port=0, client_ttl_s=1.0)
    master = DurableMaster(cfg, log.load(), log)
    for info in master.state.clients.values():
        info.last_seen -= 60  # as if building and starting had taken a minute
    master.start()
    try:
        time.sleep(0.5)  # several housekeeping passes, well inside the TTL
        assert "seg-a" in master.state.segments and len(master.state.objects) == 5
    finally:
        master.stop()


def test_a_replica_reported_bad_is_logged_gone() -> None:
    """ReplicaBad drops exactly the named replica (same segment, offset and sums), and the
    change is in the next records an HA master logs."""
    from kvcake.core.ids import SegmentName
    from kvcake.store.ha.journal import JournaledState
    from kvcake.store.protocol import PutOptions

    st = JournaledState(MasterConfig(http_port=-1))
    w = ClientId("w")
    for i in range(2):
        st.mount(ClientId(f"n{i}"), "h", SegmentName(f"s{i}"), 1 << 20)
    reps = st.put_start(w, "h", "k", 100, PutOptions(replica_num=2))
    st.put_end(w, "k", [42])
    st.records()
    bad = reps[0]
    assert not st.replica_bad("k", bad.segment, bad.offset, [41])  # other sums: a stale report
    assert not st.replica_bad("k", bad.segment, bad.offset + 64, [42])  # no replica there
    assert st.replica_bad("k", bad.segment, bad.offset, [42])
    (rec,) = st.records()
    assert isinstance(rec, ObjRec) and [r[0] for r in rec.replicas] == [reps[1].segment]
    assert st.replica_bad("k", reps[1].segment, reps[1].offset, [42])  # the last: object gone
    assert st.records() == [ObjGone("k")]
    st.check()
