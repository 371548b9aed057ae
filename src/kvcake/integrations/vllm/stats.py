"""The connector's numbers in vLLM's connector stats (logged as "KV Transfer metrics") and as
Prometheus counters on vLLM's ``/metrics`` (``kvcake_connector_<name>_total``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from kvcake.integrations.vllm.worker import STAT_NAMES

_DOCS = {
    "load_blocks": "KV blocks loaded from the kvcake pool",
    "load_bytes": "bytes loaded from the kvcake pool",
    "load_seconds": "seconds spent loading from the kvcake pool",
    "load_error_blocks": "pooled blocks that failed to load (recomputed by vLLM)",
    "load_deadline_misses": "loads abandoned at the load deadline",
    "load_wait_seconds": "seconds vLLM's forward waited for pool loads (layer-wise: less than "
    "load_seconds when the first layers compute while later ones load)",
    "save_blocks": "KV blocks saved into the kvcake pool",
    "save_bytes": "bytes saved into the kvcake pool",
    "save_seconds": "seconds spent saving into the kvcake pool (background)",
    "save_existing_blocks": "blocks another engine had already saved",
    "save_error_blocks": "blocks whose save failed",
    "save_dropped_blocks": "blocks not saved: pool absent or save queue full",
    "pd_pull_blocks": "P/D decode: KV blocks read from a prefill engine over the Transfer Engine",
    "pd_pull_bytes": "P/D decode: bytes read from prefill engines",
    "pd_pull_seconds": "P/D decode: seconds from a pull's submit to its end",
    "pd_pull_error_blocks": "P/D decode: blocks whose read failed (recomputed by vLLM)",
    "pd_pull_deadline_misses": "P/D decode: pulls abandoned at load_timeout_s",
    "pd_released_requests": "P/D prefill: kept requests freed on the decode's release note",
    "pd_lease_expired_requests": "P/D prefill: kept requests freed at pd_lease_s",
}


@dataclass
class KvcakeConnectorStats(KVConnectorStats):
    """``data`` maps a name of STAT_NAMES to a running sum."""

    def reset(self) -> None:
        self.data = dict[str, Any]()  # (typed without vLLM installed too: `make lint` alone)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.data.items()}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvcakePromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[tuple[int, str], Any] = {}
        for name in STAT_NAMES:
            metric = self._counter_cls(
                name=f"kvcake_connector_{name}", documentation=_DOCS[name], labelnames=labelnames
            )
            for engine, values in per_engine_labelvalues.items():
                self._counters[(engine, name)] = metric.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            counter = self._counters.get((engine_idx, name))
            if counter is not None and value:
                counter.inc(value)
