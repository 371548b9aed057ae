"""Write fences across a restart from the log (store/fences.py): a master logs where its
fences start before it serves; the next one, replaying that log (or its snapshot), starts
``FENCE_GAP`` above it, so every fence it hands out is newer than any the last one did."""

from __future__ import annotations

from pathlib import Path

import msgspec

from kvcake.store import protocol as P
from kvcake.store.config import MasterConfig
from kvcake.store.fences import FENCE_GAP
from kvcake.store.ha.durable import DurableMaster
from kvcake.store.ha.filelog import FileOpLog
from kvcake.store.ha.view import FenceRec, View, decode_snapshot, encode_snapshot
from kvcake.store.rpc import MasterConnection

CFG = MasterConfig(port=0, http_port=-1, events_port=-1)


def _serve_and_put(path: Path, key: str) -> tuple[int, int]:
    """A master on the log at ``path``: (where its fences start, the fence of one put)."""
    log = FileOpLog(path)
    master = DurableMaster(CFG, log.load(), log)
    master.start()
    conn = MasterConnection(master.rpc_address, timeout_s=5)
    try:
        conn.call(P.Mount("node", "h", "seg", 1 << 20))
        reply = conn.call(P.PutStart("node", "h", [key], [4096], P.PutOptions(), False))
        fence = reply.results[0].replicas[0].fence
        return master.jstate.parts.segs.fences.base, fence
    finally:
        conn.close()
        master.stop()


def test_a_restarted_master_starts_above_every_fence_of_the_last(tmp_path: Path) -> None:
    base1, fence1 = _serve_and_put(tmp_path, "a")
    assert fence1 > base1
    view = FileOpLog(tmp_path).load()
    assert view.fence == base1  # logged before it served (and kept by the stop's snapshot)
    base2, fence2 = _serve_and_put(tmp_path, "b")
    assert base2 >= base1 + FENCE_GAP and fence2 > fence1


def test_the_floor_survives_a_snapshot_and_old_snapshots_decode() -> None:
    view = View()
    view.apply(FenceRec(7))
    view.apply(FenceRec(5))  # never lowered
    assert View.of(decode_snapshot(encode_snapshot(view.snapshot()))).fence == 7
    old = msgspec.msgpack.encode({"seq": 3, "segments": [], "objects": []})  # before fences
    assert decode_snapshot(old).fence == 0
