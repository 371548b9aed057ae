"""The connector's KV events through vLLM's own per-step aggregation (``KVOutputAggregator``,
what vLLM's multi-worker executor runs on the workers' outputs): a block is published once, when
every tensor-parallel rank reported it, even when the ranks' background saves end in different
steps; a block two requests saved in one step is still published (integrations/vllm/events.py).
"""

from __future__ import annotations

from copy import copy

import pytest
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput, ModelRunnerOutput

from kvcake.integrations.vllm import events
from kvcake.integrations.vllm.events import SavedBlocks, SchedulerEvents
from kvcake.store.protocol import BlockMeta

A = BlockMeta(11, None, [1, 2, 3, 4])
B = BlockMeta(12, 11, [5, 6, 7, 8])


def step(agg: KVOutputAggregator, sched: SchedulerEvents, ranks: list[SavedBlocks]) -> list:
    """One engine step: each rank's output, vLLM's aggregation, then the scheduler connector."""
    outs: list[ModelRunnerOutput | None] = []
    for r in ranks:
        out = copy(EMPTY_MODEL_RUNNER_OUTPUT)
        out.kv_connector_output = KVConnectorOutput(kv_cache_events=r.take())
        outs.append(out)
    merged = agg.aggregate(outs)
    assert merged.kv_connector_output is not None
    sched.add(merged.kv_connector_output)
    return [(e.block_hashes, e.parent_block_hash) for e in sched.take()]


def test_ranks_reporting_in_different_steps_publish_the_block_once() -> None:
    agg, sched = KVOutputAggregator(2), SchedulerEvents(ranks=2)
    r0, r1 = SavedBlocks(), SavedBlocks()
    r0.add([A, B])
    assert step(agg, sched, [r0, r1]) == []  # rank 1's save of A and B not done yet
    r1.add([A])
    assert step(agg, sched, [r0, r1]) == [([11], None)]
    r1.add([B])
    assert step(agg, sched, [r0, r1]) == [([12], 11)]
    assert step(agg, sched, [r0, r1]) == []


def test_both_ranks_in_one_step_and_a_block_saved_twice_in_a_step() -> None:
    agg, sched = KVOutputAggregator(2), SchedulerEvents(ranks=2)
    r0, r1 = SavedBlocks(), SavedBlocks()
    r0.add([A])
    r0.add([A])  # two requests with the same prefix saved A in the same step
    r1.add([A])
    assert step(agg, sched, [r0, r1]) == [([11], None)]


def test_one_worker_a_duplicate_in_a_step_is_one_event() -> None:
    agg, sched = KVOutputAggregator(1), SchedulerEvents()
    r0 = SavedBlocks()
    r0.add([A, B])
    r0.add([A])
    assert step(agg, sched, [r0]) == [([11], None), ([12], 11)]


def test_untaken_events_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "MAX_PENDING", 2)
    sched = SchedulerEvents(ranks=2)  # rank 1 never reports: the oldest partial ones go
    r0 = SavedBlocks()
    r0.add([BlockMeta(i, None, [i]) for i in range(3)])
    sched.add(KVConnectorOutput(kv_cache_events=r0.take()))
    r1 = SavedBlocks()
    r1.add([BlockMeta(i, None, [i]) for i in range(3)])
    sched.add(KVConnectorOutput(kv_cache_events=r1.take()))
    assert [e.block_hashes for e in sched.take()] == [[1], [2]]
