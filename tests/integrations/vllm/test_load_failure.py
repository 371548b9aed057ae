"""A failed pool load inside vLLM's own scheduler (issue 30 §4): the blocks are reported for
recompute, nothing the failed step computed is saved, and the request's next lookup is a local
miss -- never the load-fail-load loop of vLLM issue 55297.

vLLM's real ``Scheduler`` (which builds the scheduler-side ``KvcakeConnector`` itself) and a
worker-side ``KvcakeConnector`` over small CPU KV tensors run in this process against a real
master and store-server; this test plays the model runner's part between them (bind the
metadata, load, save, hand ``get_block_ids_with_load_errors`` back in the step's output). The
failure is real: between the scheduler's lookup and the worker's load the pool objects are
removed, or one byte of one of them is changed in the store-server's memory. The engine-level runs (a real forward, the answer against the cold one) are in
test_connector.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from tests.store import procs
from tests.waits import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
vllm = pytest.importorskip("vllm")

BS = 16
NUM_BLOCKS = 64


@pytest.fixture(scope="module")
def pool() -> Iterator[str]:
    with procs.pool("64MiB") as addr:
        yield addr


class Engine:
    """vLLM's scheduler with the kvcake connector, and one worker-side connector."""

    def __init__(self, master: str):
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        from kvcake.fleet.procs import default_model_dir
        from kvcake.integrations.vllm.connector import KvcakeConnector

        extra = {"master": master, "backoff_s": 0.1, "load_timeout_s": 5.0}
        ktc = KVTransferConfig(
            kv_connector="KvcakeConnector", kv_connector_module_path="kvcake.integrations.vllm",
            kv_role="kv_both", kv_connector_extra_config=extra,
            kv_load_failure_policy="recompute",
        )  # fmt: skip
        cfg = VllmConfig(
            model_config=ModelConfig(model=default_model_dir(), dtype="float32", seed=0),
            scheduler_config=SchedulerConfig(
                max_num_seqs=4,
                max_num_batched_tokens=1024,
                max_model_len=1024,
                is_encoder_decoder=False,
            ),
            cache_config=CacheConfig(block_size=BS, cache_dtype="auto"),
            kv_transfer_config=ktc,
            device_config=DeviceConfig("cpu"),
        )
        cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float32)
        kcc = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])  # fmt: skip
        self.sched = Scheduler(cfg, kcc, StructuredOutputManager(cfg), block_size=BS)
        assert isinstance(self.sched.connector, KvcakeConnector)
        self.conn: KvcakeConnector = self.sched.connector  # the scheduler side
        self.worker = KvcakeConnector(cfg, KVConnectorRole.WORKER, kcc)
        self.kv = torch.zeros(NUM_BLOCKS, 2, BS, 16)
        self.worker.register_kv_caches({"layer0": self.kv})
        self.namer = self.worker.namer
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        hash_fn = get_hash_fn_by_name(cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)  # what vLLM's engine core does before the first request
        self.hasher = get_request_block_hasher(BS, hash_fn)

    def add(self, req_id: str, prompt: list[int]) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        req = Request(req_id, prompt, SamplingParams(max_tokens=4), None,
                      block_hasher=self.hasher)  # fmt: skip
        self.sched.add_request(req)
        return req

    def schedule(self) -> Any:
        return self.sched.schedule()

    def run(self, out: Any, between: Any = None) -> set[int]:
        """The model runner's part of one step; ``between`` runs after the scheduler's lookup
        and before the worker's load. Returns the blocks the worker reported."""
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        if between is not None:
            between()
        w = self.worker
        w.bind_connector_metadata(out.kv_connector_metadata)
        w.start_load_kv(None)
        w.wait_for_layer_load("layer0")
        w.wait_for_save()
        bad = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        ids = list(out.num_scheduled_tokens)
        kvo = KVConnectorOutput(invalid_block_ids=bad)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[7] for _ in ids], kv_connector_output=kvo)  # fmt: skip
        self.sched.update_from_output(out, mro)
        return bad

    def close(self) -> None:
        self.worker.shutdown()
        if self.sched.connector is not None:
            self.sched.connector.shutdown()


@pytest.fixture(scope="module")
def engine(pool: str) -> Iterator[Engine]:
    e = Engine(pool)
    wait_until(lambda: e.worker.pool.client() is not None and e.conn.pool.client() is not None,
               timeout=30, every_s=0.1, what="the connectors reaching the master")  # fmt: skip
    yield e
    e.close()


def loads(out: Any) -> list[Any]:
    return list(out.kv_connector_metadata.loads)


def flip_a_byte(client: Any, key: str) -> None:
    """One byte of ``key``'s replica changed in the store-server's memory."""
    rep = client.get_replica_desc(key).replicas[0]
    b = bytearray(1)
    client.engine.read_into(rep.segment, rep.offset + 100, b)
    b[0] ^= 0xFF
    client.engine.write(rep.segment, rep.offset + 100, b)


@pytest.mark.parametrize("how", ["removed", "corrupted"])
def test_a_load_failing_inside_vllm_is_recomputed_and_never_looked_up_again(
    engine: Engine, pool: str, how: str
) -> None:
    """``removed``: the objects vanish between lookup and load; ``corrupted``: block 1's bytes
    change in the store (the verified read refuses it; block 0 loads, blocks 1-2 recompute)."""
    from kvcake.store.client import Client

    r1, r2 = f"{how}-1", f"{how}-2"
    first_bad = 0 if how == "removed" else 1
    prompt = np.random.default_rng(len(how)).integers(100, 30000, 5 * BS + 3).tolist()
    objects = engine.namer.objects(prompt)[:3]  # 3 of its 5 full blocks are pooled
    assert objects[0].endswith("/tp0of1")
    row = engine.worker.paged.block_bytes  # type: ignore[union-attr]
    with Client(master=pool) as client:
        client.batch_put(objects, [np.full(row, i + 1, np.uint8) for i in range(len(objects))])
        req = engine.add(r1, prompt)
        out = engine.schedule()  # the lookup: 3 blocks pooled, 2 computed (and to be saved)
        (run,) = loads(out)
        assert len(run.block_ids) == 3 and out.num_scheduled_tokens[r1] == 5 * BS + 3 - 48
        assert [len(r.block_ids) for r in out.kv_connector_metadata.saves] == [2]
        # the failure, between the lookup and the load
        if how == "removed":
            bad = engine.run(out, between=lambda: client.batch_remove(objects, force=True))
        else:
            bad = engine.run(out, between=lambda: flip_a_byte(client, objects[1]))
        assert bad == set(run.block_ids[first_bad:])  # the bad block and the rest of the run
        stats = engine.worker.counters.take()
        assert stats.get("load_error_blocks") == 3 - first_bad
        assert stats.get("load_blocks", 0) == first_bad
        # blocks 3 and 4 were computed on top of the failed ones: not saved
        assert stats.get("save_dropped_blocks") == 2 and not stats.get("save_blocks")
        # vLLM took the report: the request recomputes from its first failed block
        assert req.num_computed_tokens == first_bad * BS
        assert engine.conn.planner._failed == {r1}
        out = engine.schedule()  # the recompute, no load
        assert loads(out) == [] and out.num_scheduled_tokens[r1] == len(prompt) - first_bad * BS
        engine.run(out)
        # The blocks are back in the pool. A preemption, with vLLM's own prefix cache gone,
        # makes vLLM look the request up again: a local miss, not a second load.
        client.batch_put(objects, [np.full(row, 9, np.uint8) for _ in objects])
        engine.sched.running.remove(req)
        engine.sched._preempt_request(req, time.monotonic())
        assert engine.sched.kv_cache_manager.reset_prefix_cache()
        out = engine.schedule()
        assert loads(out) == [] and out.num_scheduled_tokens[r1] == req.num_tokens  # all
        engine.run(out)
        # not vacuous: another request of the same prompt does load the pooled blocks
        from vllm.v1.request import RequestStatus

        engine.sched.finish_requests(r1, RequestStatus.FINISHED_ABORTED)
        assert engine.sched.kv_cache_manager.reset_prefix_cache()
        engine.add(r2, prompt)
        out = engine.schedule()
        assert [len(r.block_ids) for r in loads(out)] == [3]
        (save,) = out.kv_connector_metadata.saves  # blocks 3 and 4, computed by r2
        engine.kv[save.block_ids] = 0.5  # (this test plays the forward: it writes their KV)
        assert engine.run(out) == set()
        engine.worker.saver.drain()
        stats = engine.worker.counters.take()
        assert stats.get("load_blocks") == 3 and stats.get("save_blocks") == 2
        # the connector's checksums went with the put: the verified read accepts the bytes
        for key, block in zip(save.keys, save.block_ids, strict=True):
            got = client.get(engine.namer.for_rank(key, 0))
            assert bytes(got) == engine.kv[block].numpy().tobytes()
        engine.sched.finish_requests(r2, RequestStatus.FINISHED_ABORTED)
