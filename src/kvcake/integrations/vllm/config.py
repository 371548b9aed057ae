"""The connector's settings: ``kv_connector_extra_config`` keys, validated once."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvcake.core.config import require
from kvcake.core.errors import ConfigError
from kvcake.store.tenants import TENANT_RE


@dataclass(frozen=True)
class ConnectorConfig:
    """``kv_connector_extra_config`` of a KvcakeConnector (every key optional but ``master``).

    Invariants: timeouts are positive; bounds are >= 1; ``protocol`` is one the store knows.
    """

    master: str = ""  # host:port of the kvcake master's RPC (required)
    model_key: str = ""  # model part of the block keys; "" = "<model dir name>@vllm"
    tenant: str = ""  # salts the hash chain (tenants never share blocks); charged for puts
    protocol: str = "auto"  # store data path: auto (shm on one host) | tcp | shm
    lookup_timeout_s: float = 1.0  # scheduler-side pool lookup (one master RPC)
    load_timeout_s: float = 5.0  # worker-side load deadline; past it the blocks are recomputed
    # Layer-wise load: read the layers in this many groups, each layer waiting only for its
    # own (1 = every layer before the forward starts)
    load_layer_groups: int = 1
    producer_wait_s: float = 10.0  # P/D consumer: wait this long for the producer's blocks
    backoff_s: float = 5.0  # after a failed pool call, treat the pool as empty this long
    connect_retry_s: float = 10.0  # master unreachable at start-up: retry this often
    save: bool = True  # put computed prompt blocks into the pool
    max_pending_saves: int = 64  # save jobs queued for the background writer; beyond: dropped
    pd_transport: str = "te"  # P/D hand-off: te (decode reads the prefill's blocks) | pool
    pd_lease_s: float = 120.0  # prefill: longest a P/D request's blocks wait for the decode

    def __post_init__(self) -> None:
        require(bool(self.master), "kv_connector_extra_config.master is required (host:port)")
        require(":" in self.master, f"master must be host:port, got {self.master!r}")
        require(self.protocol in ("auto", "tcp", "shm"), "protocol must be auto, tcp or shm")
        require(self.pd_transport in ("te", "pool"), "pd_transport must be te or pool")
        for name in (
            "lookup_timeout_s",
            "load_timeout_s",
            "producer_wait_s",
            "backoff_s",
            "connect_retry_s",
            "pd_lease_s",
        ):
            require(getattr(self, name) > 0, f"{name} must be > 0")
        require(self.max_pending_saves >= 1, "max_pending_saves must be >= 1")
        require(self.load_layer_groups >= 1, "load_layer_groups must be >= 1")

        require(
            not self.tenant or bool(TENANT_RE.match(self.tenant)),
            f"tenant {self.tenant[:80]!r}: use 1-64 characters [A-Za-z0-9._-]",
        )

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> ConnectorConfig:
        """Build from vLLM's extra-config dict; unknown keys raise ConfigError naming them."""
        extra = dict(extra or {})
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown kv_connector_extra_config key(s) {unknown}; known: {sorted(known)}"
            )
        values: dict[str, Any] = {}
        for key, raw in extra.items():
            kind = type(known[key].default)
            try:
                values[key] = _coerce(kind, raw)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"kv_connector_extra_config.{key}: {exc}") from exc
        return cls(**values)


def _coerce(kind: type, raw: Any) -> Any:
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in ("1", "true", "yes", "on"):
            return True
        if str(raw).lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {raw!r}")
    if kind is int and isinstance(raw, float) and not raw.is_integer():
        raise ValueError(f"expected an integer, got {raw!r}")
    return kind(raw)
