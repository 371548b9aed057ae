"""Worker side of the connector: load pooled blocks into vLLM's paged KV, save new ones.

Loads are synchronous for vLLM (it calls ``start_load_kv`` before the forward) but run in a
helper thread so the wait is bounded by ``load_timeout_s``: on a miss, an error or the deadline
the blocks are reported to vLLM (``get_block_ids_with_load_errors``) and it recomputes them.
A load that overran keeps its own staging buffer, so when it finishes late it writes nowhere
vLLM reads. Saves copy the blocks out of the paged tensors at once (vLLM may reuse them after
the step) and put them into the pool from a bounded background queue.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from kvcake.core.errors import KvcakeError, StoreError
from kvcake.core.pools import started_pool
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.paged import PagedKV
from kvcake.integrations.vllm.plan import BlockRun
from kvcake.integrations.vllm.pool import PoolHandle
from kvcake.store.errors import NoSpace, ObjectAlreadyExists
from kvcake.store.readguard import ReadGuard

STAT_NAMES = (
    "load_blocks",
    "load_bytes",
    "load_seconds",
    "load_error_blocks",
    "load_deadline_misses",
    "save_blocks",
    "save_bytes",
    "save_seconds",
    "save_existing_blocks",
    "save_error_blocks",
    "save_dropped_blocks",
    "pd_pull_blocks",
    "pd_pull_bytes",
    "pd_pull_seconds",
    "pd_pull_error_blocks",
    "pd_pull_deadline_misses",
    "pd_released_requests",
    "pd_lease_expired_requests",
)


class Counters:
    """Thread-safe counters, taken (and reset) once per engine step for vLLM's stats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, float] = {}

    def add(self, **values: float) -> None:
        with self._lock:
            for k, v in values.items():
                self._data[k] = self._data.get(k, 0) + v

    def take(self) -> dict[str, float]:
        with self._lock:
            data, self._data = self._data, {}
        return data


class Saver:
    """Background writer of saved blocks. Bound: ``max_pending_saves`` jobs."""

    def __init__(self, pool: PoolHandle, counters: Counters, max_jobs: int):
        self.pool = pool
        self.counters = counters
        self._q: queue.Queue[tuple[list[str], torch.Tensor] | None] = queue.Queue(max_jobs)
        self._thread = threading.Thread(target=self._run, name="kvcake-save", daemon=True)
        self._thread.start()

    def submit(self, keys: list[str], rows: torch.Tensor) -> None:
        try:
            self._q.put_nowait((keys, rows))
        except queue.Full:
            self.counters.add(save_dropped_blocks=len(keys))

    def _run(self) -> None:
        while (job := self._q.get()) is not None:
            self._put(*job)
            self._q.task_done()

    def _put(self, keys: list[str], rows: torch.Tensor) -> None:
        client = self.pool.client()
        if client is None:
            self.counters.add(save_dropped_blocks=len(keys))
            return
        t0 = time.perf_counter()
        try:
            results = client.batch_put(keys, list(rows))
        except KvcakeError as exc:
            self.pool.failed("save", exc)
            self.counters.add(save_error_blocks=len(keys))
            return
        ok = sum(r is None for r in results)
        existing = sum(isinstance(r, ObjectAlreadyExists) for r in results)
        errors = [r for r in results if r is not None and not isinstance(r, ObjectAlreadyExists)]
        if errors and not all(isinstance(e, NoSpace) for e in errors):
            self.pool.failed("save", errors[0])
        self.counters.add(
            save_blocks=ok,
            save_bytes=ok * rows.shape[1] * rows.element_size(),
            save_seconds=time.perf_counter() - t0,
            save_existing_blocks=existing,
            save_error_blocks=len(errors),
        )

    def drain(self, timeout: float = 10.0) -> None:
        """Wait (bounded) until queued saves are written; used at shutdown and by tests."""
        deadline = time.monotonic() + timeout
        while self._q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.drain()
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(None)


class Loader:
    def __init__(self, pool: PoolHandle, counters: Counters, cfg: ConnectorConfig):
        self.pool = pool
        self.counters = counters
        self.cfg = cfg
        self._exec = started_pool(1, "kvcake-load")
        self._pending: cf.Future[Any] | None = None

    def load(self, paged: PagedKV, runs: Sequence[BlockRun]) -> set[int]:
        """Load every run into the paged KV; returns the block ids that were not loaded."""
        keys = [k for r in runs for k in r.keys]
        ids = [b for r in runs for b in r.block_ids]
        if not keys:
            return set()
        client = self.pool.client()
        if client is None or (self._pending is not None and not self._pending.done()):
            # No pool, or the previous load still hangs past its deadline: fail fast.
            self.counters.add(load_error_blocks=len(ids))
            return set(ids)
        t0 = time.perf_counter()
        buf: torch.Tensor | None = None
        guard = ReadGuard()
        if paged.direct:  # straight into vLLM's blocks: no staging buffer, no scatter
            dests = [paged.ranges(b) for b in ids]
            self._pending = fut = self._exec.submit(
                client.batch_get_into_ranges, keys, dests, guard
            )
        else:
            buf = paged.empty(len(keys))
            self._pending = fut = self._exec.submit(client.batch_get_into, keys, list(buf))
        try:
            results = fut.result(timeout=self.cfg.load_timeout_s)
        except cf.TimeoutError:
            # The read writes into vLLM's own blocks, which vLLM will now recompute: once the
            # guard is cancelled no late byte can land there (it waits out a copy at most).
            guard.cancel()
            self.pool.failed("load", TimeoutError(f"deadline {self.cfg.load_timeout_s} s"))
            self.counters.add(load_error_blocks=len(ids), load_deadline_misses=1)
            return set(ids)
        except KvcakeError as exc:
            self.pool.failed("load", exc)
            self.counters.add(load_error_blocks=len(ids))
            return set(ids)
        failed: set[int] = set()
        ok_rows: list[int] = []
        pos = 0
        for run in runs:
            broken = False
            for i in range(len(run.keys)):
                bad = isinstance(results[pos + i], StoreError)
                broken = broken or bad
                (failed.add(run.block_ids[i]) if broken else ok_rows.append(pos + i))
            pos += len(run.keys)
        if failed:
            first = next(r for r in results if isinstance(r, StoreError))
            self.pool.log.warning(
                "kvcake: %d of %d pooled blocks could not be loaded (%s); vLLM recomputes them",
                len(failed),
                len(ids),
                first,
            )
        if ok_rows and buf is not None:
            if len(ok_rows) == len(ids):
                paged.scatter(ids, buf)
            else:
                rows = torch.tensor(ok_rows, dtype=torch.long)
                paged.scatter([ids[i] for i in ok_rows], buf.index_select(0, rows))
        self.counters.add(
            load_blocks=len(ok_rows),
            load_bytes=len(ok_rows) * paged.block_bytes,
            load_seconds=time.perf_counter() - t0,
            load_error_blocks=len(failed),
        )
        return failed

    def close(self) -> None:
        self._exec.shutdown(wait=False, cancel_futures=True)


def log_for(name: str) -> logging.Logger:
    """A logger under vLLM's ``vllm`` tree, so its handlers and process prefixes apply."""
    return logging.getLogger(f"vllm.kvcake.{name}")
