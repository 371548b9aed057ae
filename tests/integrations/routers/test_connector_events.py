"""The vLLM connector's KV events (integrations/vllm/events.py): the planner sends each save's
lineage with it; the worker's saver announces it to the master and, once the put succeeded,
reports vLLM BlockStored events (get_kv_connector_kv_cache_events) that the scheduler side
yields from take_events; the master's vLLM-format stream publishes the same blocks."""

from __future__ import annotations

import time
from types import SimpleNamespace

import msgspec
import torch
import zmq
from vllm.distributed.kv_events import AllBlocksCleared, BlockStored, KVEventBatch

from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.events import SchedulerEvents
from kvcake.integrations.vllm.keys import BlockNamer
from kvcake.integrations.vllm.plan import Planner
from kvcake.integrations.vllm.pool import PoolHandle
from kvcake.integrations.vllm.worker import Counters, Saver, log_for
from kvcake.store.config import MasterConfig, StoreServerConfig
from kvcake.store.master_server import Master
from kvcake.store.server import StoreServer

NAMER = BlockNamer("m", "bfloat16", 4)
PROMPT = list(range(300, 314))  # three full blocks and two tokens


def _plan() -> list:
    p = Planner(NAMER)
    assert p.match("r", PROMPT, 0, lambda keys: [False] * len(keys)) == 0
    first = p.step([("r", [10, 11], True, 8)]).saves  # 2 blocks done
    rest = p.step([("r", [12, 13], False, 14)]).saves  # the 3rd; the partial one never
    return first + rest


def test_save_runs_carry_their_lineage() -> None:
    first, rest = _plan()
    keys = NAMER.keys(PROMPT)
    assert [b.tokens for b in first.lineage] == [PROMPT[0:4], PROMPT[4:8]]
    assert first.lineage[0].parent is None
    assert [b.parent for b in rest.lineage] == [first.lineage[1].hash]
    assert [b.hash for b in first.lineage + rest.lineage] == [int(k[-16:], 16) for k in keys]


def test_saved_blocks_become_vllm_events_on_both_streams() -> None:
    m = Master(MasterConfig(port=0, http_port=-1, events_port=-1, ecosystem_events_port=0))
    m.start()
    node = StoreServer(StoreServerConfig(master=m.rpc_address, segment_size=4 << 20, http_port=-1))
    node.start()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(m.vllm_events.address)
    time.sleep(0.3)
    pool = PoolHandle(ConnectorConfig(master=m.rpc_address), "kv_both", 5.0, log_for("test"))
    saver = Saver(pool, Counters(), 4)
    try:
        runs = _plan()
        for run in runs:
            rows = torch.zeros(len(run.keys), 32, dtype=torch.uint8)
            saver.submit([NAMER.for_rank(k, 0) for k in run.keys], rows, run.lineage)
        saver.drain()
        worker = saver.events.take()
        assert worker is not None and saver.events.take() is None
        sched = SchedulerEvents()
        sched.add(SimpleNamespace(kv_cache_events=worker))
        events = list(sched.take())
        assert all(isinstance(e, BlockStored) for e in events) and len(events) == 3
        assert [e.token_ids for e in events] == [PROMPT[0:4], PROMPT[4:8], PROMPT[8:12]]
        assert events[1].parent_block_hash == events[0].block_hashes[0]
        assert list(sched.take()) == []
        got: list = []
        while len(got) < 4 and sub.poll(10_000):
            got += msgspec.msgpack.decode(sub.recv_multipart()[2], type=KVEventBatch).events
        assert got.pop(0) == AllBlocksCleared()  # the master's stream: a new publisher
        assert [(e.block_hashes, e.token_ids) for e in got] == [
            (e.block_hashes, e.token_ids) for e in events
        ]
    finally:
        sub.close(0)
        saver.close()
        pool.close()
        node.stop()
        m.stop()
