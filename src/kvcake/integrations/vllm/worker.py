"""Worker side of the connector: the counters vLLM reports, and saves of new blocks.

Saves copy the blocks out of the paged tensors at once (vLLM may reuse them after the step)
and put them into the pool from a bounded background queue; the writer computes each object's
checksums once, from the rows it copied out (``core.integrity``), and hands them to the put.
Loads are in :mod:`.loads`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence

import torch

from kvcake.core import integrity
from kvcake.core.errors import KvcakeError
from kvcake.integrations.vllm.events import SavedBlocks
from kvcake.integrations.vllm.pool import PoolHandle
from kvcake.store.errors import NoSpace, ObjectAlreadyExists
from kvcake.store.protocol import BlockMeta
from kvcake.store.vllm_events import announce

Job = tuple[list[str], torch.Tensor, Sequence[BlockMeta]]

STAT_NAMES = (
    "load_blocks",
    "load_bytes",
    "load_seconds",
    "load_error_blocks",
    "load_deadline_misses",
    "load_wait_seconds",
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
        self._q: queue.Queue[Job | None] = queue.Queue(max_jobs)
        self.events = SavedBlocks()  # BlockStored of what was saved, for vLLM's KV events
        self._thread = threading.Thread(target=self._run, name="kvcake-save", daemon=True)
        self._thread.start()

    def submit(self, keys: list[str], rows: torch.Tensor, blocks: Sequence[BlockMeta] = ()) -> None:
        """``blocks``: the lineage of ``keys``' blocks (same order), announced to the master
        and published as KV events once saved; may be shorter (then those are not)."""
        try:
            self._q.put_nowait((keys, rows, blocks))
        except queue.Full:
            self.counters.add(save_dropped_blocks=len(keys))

    def _run(self) -> None:
        while (job := self._q.get()) is not None:
            self._put(*job)
            self._q.task_done()

    def _put(self, keys: list[str], rows: torch.Tensor, blocks: Sequence[BlockMeta]) -> None:
        client = self.pool.client()
        if client is None:
            self.counters.add(save_dropped_blocks=len(keys))
            return
        if blocks:
            with contextlib.suppress(KvcakeError):  # a hint: the put does not depend on it
                announce(client, list(blocks))
        t0 = time.perf_counter()
        # Host rows as bytes (a uint8 view: numpy has no bfloat16); the puts read these views.
        values = [memoryview(r.view(torch.uint8).numpy()) for r in rows]
        # A verifying client sums each value while it copies it into the pool (one pass over
        # the rows, not two); one that does not verify still gets the sums from here.
        sums = (
            None
            if client.cfg.verify
            else [integrity.checksums(k, v) for k, v in zip(keys, values, strict=True)]
        )
        try:
            results = client.batch_put(keys, values, checksums=sums)
        except KvcakeError as exc:
            self.pool.failed("save", exc)
            self.counters.add(save_error_blocks=len(keys))
            return
        ok = sum(r is None for r in results)
        pooled = [r is None or isinstance(r, ObjectAlreadyExists) for r in results]
        self.events.add([b for b, p in zip(blocks, pooled, strict=False) if p])
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


def log_for(name: str) -> logging.Logger:
    """A logger under vLLM's ``vllm`` tree, so its handlers and process prefixes apply."""
    return logging.getLogger(f"vllm.kvcake.{name}")
