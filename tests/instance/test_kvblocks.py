"""The KV block owner (reservations, fences), the bounded pool writer and abort log."""

from __future__ import annotations

import threading
import time

import pytest

from kvcake.core.api import SamplingParams
from kvcake.core.errors import EngineError
from kvcake.core.ids import BlockHash, InstanceId, RequestId
from kvcake.engine.block_manager import BlockManager, KVCacheFull
from kvcake.instance import kvblocks
from kvcake.instance.kvblocks import KVBlocks, Prompt
from kvcake.instance.prefill_worker import AbortLog
from kvcake.instance.store_glue import PoolWriter

R1, R2 = RequestId("r1"), RequestId("r2")
PROMPT = Prompt((300,) * 20, (BlockHash(1),), SamplingParams())  # what the prefill handed over


def owner(blocks: int = 8) -> KVBlocks:
    return KVBlocks(BlockManager(blocks, InstanceId("d")), 16, InstanceId("d"))


def test_abort_with_the_writer_confirmed_frees_at_once() -> None:
    kv = owner()
    assert len(kv.reserve(R1, 40, PROMPT)) == 3
    kv.release(R1, writer_stopped=True)
    assert kv.check()["used"] == 0


def test_unconfirmed_abort_fences_until_the_ack_or_the_quarantine(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    kv = owner(4)
    kv.reserve(R1, 64, PROMPT)  # all 4 blocks
    kv.release(R1, writer_stopped=False)
    acct = kv.check()
    assert acct["fenced"] == 4 and acct["used"] == 4
    with pytest.raises(KVCacheFull):  # nobody else gets the fenced blocks
        kv.reserve(R2, 16, PROMPT)
    with pytest.raises(EngineError):  # and the id cannot be reserved again meanwhile
        kv.reserve(R1, 16, PROMPT)
    kv.release(R1, writer_stopped=True)  # the late acknowledgement
    assert kv.check()["used"] == 0
    kv.reserve(R2, 64, PROMPT)
    kv.release(R2, writer_stopped=False)
    assert kv.check()["fenced"] == 4
    later = time.monotonic() + kvblocks.FENCE_QUARANTINE_S + 1.0
    monkeypatch.setattr(kvblocks.time, "monotonic", lambda: later)
    kv.expire()  # the quarantine is over: no write of r2 can land any more
    assert kv.check()["used"] == 0


def test_take_hands_the_table_over_and_grow_reports_full() -> None:
    kv = owner(4)
    kv.reserve(R1, 16, PROMPT)
    assert kv.owns(R1)
    taken = kv.take(R1)
    assert taken is not None and not kv.owns(R1)
    table, prompt = taken
    assert prompt is PROMPT  # the prompt travels with its reservation
    assert kv.grow(table, 64) and not kv.grow(table, 80)
    kv.free(table)
    assert kv.check()["used"] == 0


class SlowPool:
    """Stands in for the store at the PoolLink boundary: a put that takes a while."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def put(self, hashes: list[BlockHash], views: list[memoryview]) -> list[BlockHash]:
        self.gate.wait(5)
        return list(hashes)


def test_pool_writer_bounds_pinned_blocks_with_back_pressure() -> None:
    kv = owner(16)
    pool = SlowPool()
    w = PoolWriter(pool, kv, lambda b: memoryview(b""), max_pinned=4)
    a = kv.allocate(6)
    hs = [BlockHash(i + 1) for i in range(6)]
    assert w.put(hs[:3], a[:3]) and w.pinned == 3
    assert not w.put(hs[3:5], a[3:5], block=False)  # full: the decode thread skips
    t0 = time.perf_counter()
    assert not w.put(hs[3:5], a[3:5], timeout_s=0.2)  # the prefill thread waited, then gave up
    assert time.perf_counter() - t0 >= 0.2 and w.skipped == 2
    pool.gate.set()
    assert w.put(hs[3:5], a[3:5])  # room again
    w.close()
    kv.free(a)
    assert w.pinned == 0 and kv.check()["used"] == 0


def test_abort_log_is_bounded() -> None:
    log = AbortLog(max_ids=3)
    for i in range(10):
        log.add(RequestId(f"r{i}"))
    assert len(log) == 3 and RequestId("r9") in log and RequestId("r0") not in log
