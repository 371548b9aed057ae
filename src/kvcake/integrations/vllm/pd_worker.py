"""Worker side of the direct P/D path: vLLM's KV tensors as Transfer Engine segments, and the
decode's reads from a prefill's segments into its own blocks (see :mod:`.pd`).

The KV planes are registered (no copy: the segments *are* vLLM's tensors) with the Transfer
Engine the worker's pool client already runs (its TCP server answers the decodes' reads; its
directory is the kvcake master's), so the master drops them with the client when the worker
dies. A pull is one batch of READs (every layer's planes x the request's blocks, neighbours
coalesced); it runs in the engine's worker threads while vLLM keeps stepping, and is polled in
``get_finished``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvcake.core.errors import KvcakeError
from kvcake.core.ids import SegmentName
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.paged import PagedKV
from kvcake.integrations.vllm.pd import PdStep, PullJob
from kvcake.integrations.vllm.pd_wire import Notifier, segment_name
from kvcake.integrations.vllm.pool import PoolHandle
from kvcake.integrations.vllm.worker import Counters
from kvcake.transfer import Op, TransferRequest

IDLE_WAIT_S = 0.002  # a step with no forward and a pull running yields this long
ZOMBIE_MAX_S = 300.0  # a read past its deadline is given up (and its blocks freed) after this


@dataclass
class _Pull:
    job: PullJob
    batch: int | None  # None: failed before submitting
    t0: float  # perf_counter at submit
    deadline: float  # monotonic
    errors: set[int]


class PdWorker:
    """Bounds: one entry per request with a pull not yet freed by vLLM."""

    def __init__(
        self, pool: PoolHandle, counters: Counters, cfg: ConnectorConfig, engine_id: str,
        rank: int, log: logging.Logger, enabled: bool = True,
    ):  # fmt: skip
        self.pool = pool
        self.counters = counters
        self.cfg = cfg
        self.engine_id = engine_id
        self.rank = rank
        self.log = log
        self.notifier = Notifier()
        self.paged: PagedKV | None = None
        self.te: Any = None
        self.names: list[str] = []
        self.plane_bytes: list[int] = []
        self._register_failed = not enabled  # pd_transport=pool: KV memory not exposed
        self._inflight: dict[str, _Pull] = {}
        self._zombies: dict[str, _Pull] = {}  # reported failed; the batch still runs
        self._ended: set[str] = set()  # pulls over, blocks still owned by the request
        self._held: set[str] = set()  # finished by vLLM, blocks held until the pull ends
        self._recv_done: set[str] = set()
        self._frees: set[str] = set()
        self._errors: set[int] = set()
        self.idle = False  # this step ran no forward (set by the connector)

    # ---- registration ----------------------------------------------------------------------

    def attach(self, paged: PagedKV) -> None:
        self.paged = paged
        self.plane_bytes = [p.shape[1] * p.element_size() for p in paged.planes]
        self._engine()

    def _engine(self) -> Any:
        """The Transfer Engine holding this worker's KV segments (registered on first use)."""
        if self.te is not None or self.paged is None or self._register_failed:
            return self.te
        client = self.pool.connected()
        if client is None:
            return None
        te = client.engine
        names = [segment_name(self.engine_id, self.rank, i) for i in range(len(self.plane_bytes))]
        done: list[str] = []
        try:
            for name, plane in zip(names, self.paged.planes, strict=True):
                te.register_memory(name, plane)
                done.append(name)
        except KvcakeError as exc:
            for name in done:
                te.unregister(name)
            self._register_failed = True
            self.log.warning(
                "kvcake: cannot register the KV tensors with the Transfer Engine (%s); "
                "P/D over te is off in this worker (set pd_transport=pool)", exc
            )  # fmt: skip
            return None
        self.te, self.names = te, names
        self.log.info(
            "kvcake: %d KV planes registered as Transfer Engine segments %s..%s at %s",
            len(names), names[0], names[-1], te.addresses,
        )  # fmt: skip
        return te

    # ---- reads -----------------------------------------------------------------------------

    def step(self, pd: PdStep) -> None:
        """Start this step's pulls; note the prefill blocks the scheduler frees."""
        self._frees.update(pd.frees)
        if pd.frees:
            self.counters.add(pd_released_requests=len(pd.frees) - pd.expired,
                              pd_lease_expired_requests=pd.expired)  # fmt: skip
        for job in pd.pulls:
            self._start(job)

    def _start(self, job: PullJob) -> None:
        now = time.monotonic()
        pull = _Pull(job, None, time.perf_counter(), now + self.cfg.load_timeout_s, set())
        te = self._engine()
        try:
            if te is None:
                raise KvcakeError(
                    "no Transfer Engine in this worker (pd_transport=pool, or the pool "
                    "client is not connected yet)"
                )
            self._check_source(te, job)
            pull.batch = te.submit(self._requests(job))
        except KvcakeError as exc:
            self.log.warning(
                "kvcake: %s: reading the prefill's KV from engine %s failed (%s); vLLM "
                "recomputes %d blocks", job.req_id, job.remote.engine_id, exc,
                len(job.local_block_ids),
            )  # fmt: skip
            self._fail(job.req_id, job, pull)
            self._end(job.req_id, pull)
            return
        self._inflight[job.req_id] = pull

    def _check_source(self, te: Any, job: PullJob) -> None:
        """The prefill's planes exist and have this worker's geometry (same model/layout).
        Cached lookups (the batch's own): an engine id names one engine run, so its planes
        never change size; a gone peer fails the batch and is forgotten."""
        for p in (0, len(self.plane_bytes) - 1):
            info = te.registry.target(segment_name(job.remote.engine_id, self.rank, p))
            want = job.remote.num_blocks * self.plane_bytes[p]
            if info.size != want:
                raise KvcakeError(f"plane {p} is {info.size} B, expected {want} B (layout?)")

    def _requests(self, job: PullJob) -> list[TransferRequest]:
        reqs = []
        for p, bb in enumerate(self.plane_bytes):
            local = SegmentName(self.names[p])
            remote = SegmentName(segment_name(job.remote.engine_id, self.rank, p))
            for lb, rb in zip(job.local_block_ids, job.remote_block_ids, strict=True):
                reqs.append(TransferRequest(Op.READ, local, lb * bb, remote, rb * bb, bb))
        return reqs

    def _fail(self, req_id: str, job: PullJob, pull: _Pull) -> None:
        self._errors.update(job.local_block_ids)
        self._recv_done.add(req_id)
        self.counters.add(pd_pull_error_blocks=len(job.local_block_ids))

    def _end(self, req_id: str, pull: _Pull) -> None:
        """The pull's batch is over: release the prefill's blocks."""
        self.notifier.send(pull.job.remote.notify, [pull.job.remote.request_id])
        self._ended.add(req_id)

    def _outcome(self, pull: _Pull) -> set[int] | None:
        """Failed local blocks once the batch is over, None while it runs."""
        te = self.te
        try:
            if not te.status(pull.batch).done:
                return None
            result = te.wait(pull.batch)
        except KvcakeError:  # swept or unknown: count it as failed
            return set(pull.job.local_block_ids)
        n = len(pull.job.local_block_ids)
        bad = {pull.job.local_block_ids[i % n] for i in result.failed}
        if bad:
            first = result.results[result.failed[0]]
            self.log.warning(
                "kvcake: %s: %d of %d blocks could not be read from engine %s (%s); vLLM "
                "recomputes them", pull.job.req_id, len(bad), n, pull.job.remote.engine_id,
                first.error,
            )  # fmt: skip
        return bad

    def poll(self, finished_req_ids: Iterable[str]) -> tuple[set[str], set[str]]:
        """(finished sending, finished receiving) for ``get_finished``."""
        self._engine()  # a master that came up late: register now, so decodes can read us
        if self._inflight and self.idle:
            time.sleep(IDLE_WAIT_S)
        for rid in finished_req_ids:
            if rid in self._inflight or rid in self._zombies or rid in self._ended:
                self._held.add(rid)
        now = time.monotonic()
        for rid, pull in list(self._inflight.items()):
            bad = self._outcome(pull)
            if bad is None and now < pull.deadline:
                continue
            del self._inflight[rid]
            if bad is None:  # past the deadline: recompute now, keep the blocks until it ends
                self.log.warning(
                    "kvcake: %s: read from engine %s not done after %.1f s (load_timeout_s); "
                    "vLLM recomputes", rid, pull.job.remote.engine_id, self.cfg.load_timeout_s,
                )  # fmt: skip
                self.counters.add(pd_pull_deadline_misses=1)
                self._fail(rid, pull.job, pull)
                self._zombies[rid] = pull
                continue
            ok = len(pull.job.local_block_ids) - len(bad)
            self._errors.update(bad)
            self._recv_done.add(rid)
            self.counters.add(
                pd_pull_blocks=ok, pd_pull_bytes=ok * sum(self.plane_bytes),
                pd_pull_seconds=time.perf_counter() - pull.t0, pd_pull_error_blocks=len(bad),
            )  # fmt: skip
            self._end(rid, pull)
        for rid, pull in list(self._zombies.items()):
            if self._outcome(pull) is not None or now - pull.deadline > ZOMBIE_MAX_S:
                del self._zombies[rid]
                self._end(rid, pull)
        sending = self._frees | (self._held & self._ended)
        self._held -= sending
        self._ended -= sending
        self._frees = set()
        recving, self._recv_done = self._recv_done, set()
        return sending, recving

    def load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    def close(self) -> None:
        self.notifier.close()
        if self.te is not None:
            for name in self.names:
                with contextlib.suppress(KvcakeError):
                    self.te.unregister(name)
