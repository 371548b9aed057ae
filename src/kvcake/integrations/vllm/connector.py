"""``KvcakeConnector``: a vLLM V1 KV connector over the kvcake pool (docs/integrations/vllm.md).

vLLM creates one instance in its scheduler (engine core) process and one per worker. The
scheduler side asks the pool which leading prompt blocks it holds and plans loads and saves
(:mod:`.plan`); the worker side moves bytes between the pool and the paged KV tensors
(:mod:`.worker`). Either side connects to the kvcake master on its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from kvcake.core.errors import ConfigError, KvcakeError
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.events import SchedulerEvents
from kvcake.integrations.vllm.keys import BlockNamer
from kvcake.integrations.vllm.loads import Loader, PendingLoad
from kvcake.integrations.vllm.paged import PagedKV
from kvcake.integrations.vllm.pd import PdScheduler, PdStep
from kvcake.integrations.vllm.pd_wire import TRANSPORT_KEY
from kvcake.integrations.vllm.pd_worker import PdWorker
from kvcake.integrations.vllm.plan import BlockRun, Planner
from kvcake.integrations.vllm.pool import PoolHandle
from kvcake.integrations.vllm.stats import KvcakeConnectorStats, KvcakePromMetrics
from kvcake.integrations.vllm.worker import Counters, Saver, log_for

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = log_for("connector")
NO_SAVE_MAX = 4096  # requests remembered as "load failed: save nothing" (far above a batch)


@dataclass
class KvcakeMetadata(KVConnectorMetadata):
    """Scheduler -> worker, once per step (pickled by vLLM)."""

    loads: list[BlockRun] = field(default_factory=list)
    saves: list[BlockRun] = field(default_factory=list)
    pd: PdStep = field(default_factory=PdStep)  # direct P/D: pulls to start, blocks to free


def namer_for(vllm_config: VllmConfig, cfg: ConnectorConfig) -> BlockNamer:
    """Keys carry the model, the KV dtype, vLLM's block size (= the pool's block size) and,
    per object, the tensor-parallel rank and size (keys.py)."""
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    pc = vllm_config.parallel_config
    if pc.pipeline_parallel_size > 1:  # each stage would save its own layers under one key
        raise ConfigError("KvcakeConnector: pipeline parallelism is not supported (keys carry "
                          "the tensor-parallel rank only)")  # fmt: skip
    model = cfg.model_key or f"{os.path.basename(str(mc.model).rstrip('/'))}@vllm"
    dtype = str(mc.dtype).removeprefix("torch.") if cc.cache_dtype == "auto" else cc.cache_dtype
    return BlockNamer(model, dtype, cc.block_size, cfg.tenant, pc.tensor_parallel_size)


def tp_rank() -> int:
    try:
        # lazy: optional dependency (vllm)
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (ImportError, AssertionError, AttributeError):
        return 0


def producer_blocks(params: dict[str, Any] | None) -> int:
    """Blocks a P/D producer said it pools (its ``kv_transfer_params``), 0 for other requests."""
    if not params or not params.get("do_remote_prefill"):
        return 0
    try:
        return max(0, int(params.get("kvcake_blocks", 0)))
    except (TypeError, ValueError):
        return 0


class KvcakeConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = self._kv_transfer_config
        self.cfg = ConnectorConfig.from_extra(ktc.kv_connector_extra_config)
        self.namer = namer_for(vllm_config, self.cfg)
        # kv_producer only saves, kv_consumer only loads; kv_both does both.
        self.loads_enabled = ktc.kv_role != "kv_producer"
        self.saves_enabled = self.cfg.save and ktc.kv_role != "kv_consumer"
        self.num_blocks = kv_cache_config.num_blocks
        self.engine_id = str(ktc.engine_id)
        if ktc.kv_load_failure_policy != "recompute" and role == KVConnectorRole.SCHEDULER:
            log.warning(
                "kvcake: kv_load_failure_policy=%r: a failed pool load fails the request; set "
                '"kv_load_failure_policy": "recompute" in --kv-transfer-config to recompute',
                ktc.kv_load_failure_policy,
            )
        if role == KVConnectorRole.SCHEDULER:
            self.pool = PoolHandle(self.cfg, "vLLM scheduler", self.cfg.lookup_timeout_s, log)
            self.planner = Planner(self.namer, save=self.saves_enabled)
            self.kv_events = SchedulerEvents(self.namer.tp_size)  # ranks that save a block
            self._awaiting: dict[str, float] = {}  # P/D consumers waiting for the producer
            self.pd = PdScheduler(
                self.engine_id, self.num_blocks, self.namer.block_tokens, self.cfg.pd_lease_s,
                log, produce=self.cfg.pd_transport == "te" and ktc.kv_role != "kv_consumer",
            )  # fmt: skip
        else:
            self.pool = PoolHandle(self.cfg, "vLLM worker", self.cfg.load_timeout_s, log)
            self.counters = Counters()
            self.saver = Saver(self.pool, self.counters, self.cfg.max_pending_saves)
            self.loader = Loader(self.pool, self.counters, self.cfg)
            self.paged: PagedKV | None = None
            self.rank = 0  # this worker's tensor-parallel rank (register_kv_caches)
            self._load_errors: set[int] = set()
            # Requests whose load failed on this worker: none of their blocks is saved any more
            # (the step that found the failure computed on top of the failed blocks). Bounded;
            # entries leave when vLLM reports the request finished (get_finished).
            self._no_save: dict[str, None] = {}
            self._load: PendingLoad | None = None  # this step's, until the forward ends
            self.pdw = PdWorker(
                self.pool, self.counters, self.cfg, self.engine_id, 0, log,
                enabled=self.cfg.pd_transport == "te",
            )  # fmt: skip

    # ---- scheduler side --------------------------------------------------------------------

    def _exists(self, keys: list[str]) -> list[bool]:
        client = self.pool.client()
        if client is None:
            return [False] * len(keys)
        try:
            return list(client.batch_is_exist(keys))
        except KvcakeError as exc:
            self.pool.failed("lookup", exc)
            return [False] * len(keys)

    def update_connector_output(self, connector_output: Any) -> None:
        """The workers' step output: blocks whose load failed make their requests local misses
        from now on (vLLM recomputes them; a new lookup must not load them again)."""
        self.kv_events.add(connector_output)  # the saved blocks, for take_events
        bad = set(getattr(connector_output, "invalid_block_ids", None) or ())
        if bad:
            failed = self.planner.load_failed(bad)
            if failed:
                log.warning(
                    "kvcake: %d pooled block(s) failed to load for %d request(s); vLLM "
                    "recomputes them and these requests do not look the pool up again",
                    len(bad), len(failed),
                )  # fmt: skip

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        rid = request.request_id
        direct = self.pd.match(request, num_computed_tokens)  # a decode fed by a te prefill
        if direct is not None:
            self.planner.finished(rid)
            return direct
        if self.pool.client() is None:
            self.planner.finished(rid)
            return 0, False
        lookup = self._exists if self.loads_enabled else (lambda keys: [False] * len(keys))
        prompt = list(request.prompt_token_ids or [])
        # A prefill sending over the Transfer Engine does not also pool the request's blocks.
        save = not self._sends_direct(request.kv_transfer_params)
        ext = self.planner.match(rid, prompt, num_computed_tokens, lookup, save=save)
        want = producer_blocks(request.kv_transfer_params)
        if want:  # P/D: the producer named how many blocks it pools; wait (bounded) for them
            need = min(want, (len(prompt) - 1) // self.namer.block_tokens)
            have = (num_computed_tokens + ext) // self.namer.block_tokens
            if have < need:
                first = self._awaiting.setdefault(rid, time.monotonic())
                if time.monotonic() - first < self.cfg.producer_wait_s:
                    return None, False  # vLLM asks again next step
                log.warning(
                    "kvcake: %s: %d of the producer's %d blocks pooled after %.1f s; the rest "
                    "is recomputed",
                    rid,
                    have,
                    need,
                    self.cfg.producer_wait_s,
                )
            self._awaiting.pop(rid, None)
        return ext, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if self.pd.allocated(request, blocks.get_block_ids()[0], num_external_tokens):
            return
        if num_external_tokens > 0:
            ids = blocks.get_block_ids()[0]
            self.planner.allocated(request.request_id, ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        n_sched = scheduler_output.num_scheduled_tokens
        scheduled: list[tuple[str, list[int] | None, bool, int]] = []
        for req in scheduler_output.scheduled_new_reqs:
            done = req.num_computed_tokens + n_sched.get(req.req_id, 0)
            scheduled.append((req.req_id, list(req.block_ids[0]), True, done))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new = cached.new_block_ids[i]
            done = cached.num_computed_tokens[i] + n_sched.get(req_id, 0)
            resumed = req_id in cached.resumed_req_ids
            scheduled.append((req_id, list(new[0]) if new else None, resumed, done))
        plan = self.planner.step(scheduled)
        return KvcakeMetadata(loads=plan.loads, saves=plan.saves, pd=self.pd.step())

    def _sends_direct(self, params: dict[str, Any] | None) -> bool:
        """A P/D prefill request answered over the Transfer Engine (the engine's
        ``pd_transport``, or the request's ``kvcake_transport``, is "te")."""
        if not params or not params.get("do_remote_decode") or self.pd.inbox is None:
            return False  # (no inbox: a kv_consumer or pd_transport=pool engine: the pool)
        return params.get(TRANSPORT_KEY, self.cfg.pd_transport) == "te"

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        # lazy: optional dependency (vllm)
        from vllm.v1.request import RequestStatus

        self.planner.finished(request.request_id)
        self._awaiting.pop(request.request_id, None)
        params = request.kv_transfer_params or {}
        if self._sends_direct(params):
            if request.status not in (
                RequestStatus.FINISHED_LENGTH_CAPPED,
                RequestStatus.FINISHED_STOPPED,
            ):
                return False, None  # aborted: nobody will read its blocks
            return self.pd.produced(request, block_ids)
        hold = self.pd.finished(request)  # a decode whose read may still land: keep blocks
        if not params.get("do_remote_decode"):
            return hold, None
        # P/D handshake: the consumer continues with these params and waits until the pool
        # holds this many blocks (they were copied out and queued for saving during prefill,
        # so this request's blocks need not be held).
        blocks = len(request.prompt_token_ids or []) // self.namer.block_tokens
        return False, {"do_remote_prefill": True, "kvcake_blocks": blocks,
                       "kvcake_model_key": self.namer.model}  # fmt: skip

    # ---- worker side -----------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.paged = PagedKV(kv_caches, self.num_blocks)
        self.rank = self.pdw.rank = tp_rank()
        self.pdw.attach(self.paged)
        log.info(
            "kvcake: %d KV planes, %d blocks of %d B, keys %s/%s/%d/<hash>/tp%dof%d",
            len(self.paged.planes),
            self.num_blocks,
            self.paged.block_bytes,
            self.namer.model,
            self.namer.dtype,
            self.namer.block_tokens,
            self.rank,
            self.namer.tp_size,
        )

    def _mine(self, key: str) -> str:
        """The scheduler plans with block keys; this worker reads and writes its rank's objects."""
        return self.namer.for_rank(key, self.rank)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcakeMetadata)
        self._finish_load()  # (a step that ended without wait_for_save)
        if meta.loads and self.paged is not None:
            self._load = self.loader.start(self.paged, meta.loads, self._mine)
            if not self._load.group_of:  # a whole load: done before the forward
                self._finish_load()
        if meta.pd.pulls or meta.pd.frees:
            self.pdw.step(meta.pd)
        # A step without a forward (vLLM keeps stepping while a pull runs): let the pull's
        # Transfer Engine threads have the core instead of spinning.
        self.pdw.idle = getattr(forward_context, "attn_metadata", True) is None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        for rid in finished_req_ids:
            self._no_save.pop(rid, None)
        return self.pdw.poll(finished_req_ids)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._load is not None:
            self._load.wait_layer(layer_name)  # never raises: a failure is recomputed

    def _finish_load(self) -> None:
        if self._load is not None:
            load, self._load = self._load, None
            failed = load.finish()
            self._load_errors |= failed
            for rid in load.failed_requests(failed):
                self._no_save[rid] = None
            while len(self._no_save) > NO_SAVE_MAX:  # oldest first: a lost finish notice
                del self._no_save[next(iter(self._no_save))]

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # saved once per step in wait_for_save, all layers in one gather

    def wait_for_save(self) -> None:
        self._finish_load()
        if not self.has_connector_metadata() or self.paged is None:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcakeMetadata)
        for run in meta.saves:
            if run.req_id in self._no_save:
                self.counters.add(save_dropped_blocks=len(run.keys))
                continue
            rows = self.paged.empty(len(run.block_ids))
            self.paged.gather(run.block_ids, rows)  # vLLM may reuse the blocks after this step
            self.saver.submit([self._mine(k) for k in run.keys], rows, run.lineage)

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._finish_load()
        errors, self._load_errors = self._load_errors, set()
        return errors | self.pdw.load_errors()

    def get_kv_connector_kv_cache_events(self) -> Any:
        """BlockStored of the blocks this worker saved since the last step (events.py)."""
        return self.saver.events.take() if self.role == KVConnectorRole.WORKER else None

    def take_events(self) -> Iterator[Any]:
        """The workers' BlockStored events, for vLLM's KV-event publisher (scheduler side)."""
        if self.role == KVConnectorRole.SCHEDULER:
            yield from self.kv_events.take()

    def get_kv_connector_stats(self) -> Any:
        if self.role != KVConnectorRole.WORKER:
            return None  # the scheduler's hits are counted by vLLM (external_prefix_cache_*)
        data = self.counters.take()
        if not data:
            return None

        return KvcakeConnectorStats(data=data)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> Any:
        return KvcakeConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> Any:
        return KvcakePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self.role == KVConnectorRole.WORKER:
            self.saver.close()
            self.loader.close()
            self.pdw.close()
        else:
            self.pd.close()
        self.pool.close()
