"""The connector's handle on the kvcake pool: connect without blocking vLLM, back off on errors.

An unreachable master at start-up is logged once; vLLM serves without the pool while a daemon
thread retries every ``connect_retry_s``. After a failed call the pool counts as absent for
``backoff_s`` so a dead store costs one timeout, not one per request.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from kvcake.core.errors import KvcakeError
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig


class PoolHandle:
    def __init__(self, cfg: ConnectorConfig, role: str, rpc_timeout_s: float, log: logging.Logger):
        self.cfg = cfg
        self.role = role
        self.rpc_timeout_s = rpc_timeout_s
        self.log = log
        self._client: Any = None
        self._down_until = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        if not self._connect(first=True):
            threading.Thread(target=self._retry, name="kvcake-pool-connect", daemon=True).start()

    def _connect(self, first: bool) -> bool:
        try:
            client = Client(
                ClientConfig(
                    master=self.cfg.master,
                    protocol=self.cfg.protocol,
                    rpc_timeout_s=self.rpc_timeout_s,
                    tune_malloc=False,  # vLLM's process: leave its allocator alone
                    tenant=self.cfg.tenant,  # the engine's puts count against its quota
                )
            )
        except (KvcakeError, OSError) as exc:
            if first:
                self.log.warning(
                    "kvcake: master %s unreachable (%s): %s serves without the KV pool, "
                    "retrying every %.0f s",
                    self.cfg.master,
                    exc,
                    self.role,
                    self.cfg.connect_retry_s,
                )
            return False
        with self._lock:
            if self._stop.is_set():
                client.close()
                return True
            self._client = client
        if not first:
            self.log.warning("kvcake: %s connected to master %s", self.role, self.cfg.master)
        return True

    def _retry(self) -> None:
        while not self._stop.wait(self.cfg.connect_retry_s):
            if self._connect(first=False):
                return

    def client(self) -> Any:
        """The store client, or None while the pool is unreachable or backing off."""
        if self._client is None or time.monotonic() < self._down_until:
            return None
        return self._client

    def connected(self) -> Any:
        """The store client once connected, back-off or not (the P/D path's Transfer Engine)."""
        return self._client

    def failed(self, what: str, exc: BaseException) -> None:
        """A call failed: log once per back-off window and treat the pool as absent meanwhile."""
        now = time.monotonic()
        if now >= self._down_until:
            self.log.warning(
                "kvcake: %s %s failed (%s); pool skipped for %.0f s, vLLM recomputes",
                self.role,
                what,
                exc,
                self.cfg.backoff_s,
            )
        self._down_until = now + self.cfg.backoff_s

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
