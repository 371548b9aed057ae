"""Connecting an instance to the store (the global KV pool), and its background writer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kvcake.core.api import KVEventKind
from kvcake.core.ids import BlockHash
from kvcake.core.pools import started_pool
from kvcake.instance.kvblocks import KVBlocks
from kvcake.serve.config import InstanceConfig
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig

log = logging.getLogger(__name__)


def connect_store(cfg: InstanceConfig, te: Any) -> Any:
    """A :class:`kvcake.store.Client` of the master at ``cfg.master`` (None without one). The
    client contributes no memory: storage nodes do."""
    if not cfg.master:
        return None

    return Client(ClientConfig(master=cfg.master, hostname=cfg.host))


class PoolWriter:
    """Puts named blocks into the pool on one background thread.

    A queued put holds a reference on its blocks (so they are not evicted before they are
    copied out), so the queue is bounded by *pinned blocks*, not by jobs: at most
    ``max_pinned`` blocks wait at any time. ``put(block=True)`` (the prefill thread) waits for
    room — back-pressure: a prefill that outruns the pool slows down instead of pinning the
    whole KV memory; ``put(block=False)`` (the decode thread, which must not stall a batch) skips
    the put when the queue is full and counts it in ``skipped``."""

    def __init__(
        self, pool: Any, kv: KVBlocks, view: Callable[[int], memoryview], max_pinned: int,
        name: str = "put",
    ):  # fmt: skip
        self.pool = pool  # kvcake.instance.kvlink.PoolLink
        self.kv = kv
        self.view = view
        self.max_pinned = max(1, max_pinned)
        self._exec = started_pool(1, name)
        self._cv = threading.Condition()
        self.pinned = 0
        self.skipped = 0
        self._closed = False

    def put(
        self, hashes: list[BlockHash], blocks: list[int], block: bool = True,
        timeout_s: float = 30.0, tenant: str = "",
    ) -> bool:  # fmt: skip
        """Queue a put of ``blocks`` (named ``hashes``, charged to ``tenant``); False if it
        was skipped."""
        n = min(len(blocks), self.max_pinned)
        hashes, blocks = hashes[:n], blocks[:n]
        if not n:
            return False
        with self._cv:
            room = self._cv.wait_for(
                lambda: self._closed or self.pinned + n <= self.max_pinned,
                timeout_s if block else 0.0,
            )
            if self._closed or not room:
                self.skipped += 1
                return False
            self.pinned += n
        self.kv.acquire(blocks)
        try:
            self._exec.submit(self._put, hashes, blocks, tenant)
        except RuntimeError:  # shut down meanwhile
            self._done(blocks)
            return False
        return True

    def _put(self, hashes: list[BlockHash], blocks: list[int], tenant: str = "") -> None:
        try:
            views = [self.view(b) for b in blocks]
            by = {"tenant": tenant} if tenant else {}  # (a test's pool takes no tenant)
            stored = self.pool.put(hashes, views, **by)
            self.kv.pool_event(KVEventKind.STORED, stored)
        except Exception:
            log.exception("putting %d blocks into the pool failed", len(blocks))
        finally:
            self._done(blocks)

    def _done(self, blocks: list[int]) -> None:
        self.kv.free(blocks)
        with self._cv:
            self.pinned -= len(blocks)
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._exec.shutdown(wait=True)
