"""Connecting an instance to the store (the global KV pool)."""

from __future__ import annotations

from typing import Any

from kvcake.serve.config import InstanceConfig


def connect_store(cfg: InstanceConfig, te: Any) -> Any:
    """A :class:`kvcake.store.Client` of the master at ``cfg.master`` (None without one). The
    client contributes no memory: storage nodes do."""
    if not cfg.master:
        return None
    from kvcake.store.client import Client
    from kvcake.store.config import ClientConfig

    return Client(ClientConfig(master=cfg.master, hostname=cfg.host))
