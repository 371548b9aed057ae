"""Mooncake's replica copy / move tasks through the shim, against a real master and three
stores that each mount a segment: the tasks run, ``query_task`` follows them to the end, and
the replica descriptors and bytes show what they did."""

from __future__ import annotations

from kvcake.compat.mooncake._types import ReplicateConfig, TaskStatus, TaskType
from kvcake.compat.mooncake.store import MooncakeDistributedStore
from tests.store.conftest import Factory
from tests.waits import wait_until

MB = 1024 * 1024


def wait_task(s: MooncakeDistributedStore, tid: tuple[int, int]) -> object:
    def finished() -> object:
        resp, code = s.query_task(tid)
        assert code == 0 and resp is not None
        return resp if resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED) else None

    return wait_until(finished, timeout=30, every_s=0.02, what=f"task {tid} finished")


def segments_of(s: MooncakeDistributedStore, key: str) -> list[str]:
    out = []
    for d in s.get_replica_desc(key):
        assert d.is_memory_replica()
        out.append(d.get_memory_descriptor().buffer_descriptor.transport_endpoint)
    return sorted(out)


def test_copy_and_move_tasks_run_and_are_reported(procs: Factory) -> None:
    master = procs("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "2")
    stores = []
    for _ in range(3):
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 8 * MB, 8 * MB, "tcp", "", master.info["rpc"])
        assert rc == 0
        stores.append(s)
    a, b, c = stores
    try:
        cfg = ReplicateConfig()
        cfg.preferred_segment = a.get_hostname()
        value = bytes(range(256)) * 1000
        assert a.put("obj", value, cfg) == 0
        before = segments_of(a, "obj")
        assert len(before) == 1

        tid, code = a.create_copy_task("obj", [b.get_hostname()])
        assert code == 0 and tid != (0, 0)
        resp = wait_task(a, tid)
        assert resp.status is TaskStatus.SUCCESS and resp.type is TaskType.REPLICA_COPY
        assert resp.last_updated_at_ms_epoch >= resp.created_at_ms_epoch > 0
        assert len(segments_of(a, "obj")) == 2
        assert b.get("obj") == value and c.get("obj") == value

        tid, code = a.create_move_task("obj", b.get_hostname(), c.get_hostname())
        assert code == 0
        assert wait_task(a, tid).status is TaskStatus.SUCCESS
        after = segments_of(a, "obj")
        assert len(after) == 2 and before[0] in after  # a's replica stays, b's moved to c
        assert c.get("obj") == value

        # A copy onto a segment that already holds a replica fails as a task, with a reason.
        tid, code = a.create_copy_task("obj", [a.get_hostname()])
        assert code == 0
        failed = wait_task(a, tid)
        assert failed.status is TaskStatus.FAILED and "already has a replica" in failed.message
        assert a.get("obj") == value

        # Input errors are refused up front, as in the wheel; unknown ids stay unknown.
        assert a.create_copy_task("missing", [b.get_hostname()])[1] == -704
        assert a.create_copy_task("obj", ["nowhere"])[1] == -600
        assert a.create_move_task("obj", "", c.get_hostname())[1] == -600
        assert b.query_task(tid) == (None, -1400)  # another client's task
        assert a.query_task((1, 2)) == (None, -1400)

        # batch_replica_clear on one segment drops that replica only; the last one, the key.
        assert a.batch_replica_clear(["obj"], c.get_hostname()) == ["obj"]
        assert segments_of(a, "obj") == before and a.get("obj") == value
        assert a.batch_replica_clear(["obj", "missing"], a.get_hostname()) == ["obj"]
        assert a.is_exist("obj") == 0
    finally:
        for s in stores:
            assert s.close() == 0
