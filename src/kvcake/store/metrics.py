"""Prometheus metrics of the master: op counts and latencies (observed per request) and pool
gauges (read from the state at scrape time). Each master has its own registry, so several
masters in one test process do not collide."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from kvcake.store.master_state import MasterState


class _PoolCollector(Collector):
    def __init__(self, state: MasterState):
        self.state = state

    def collect(self) -> Iterator[Metric]:
        with self.state.lock:  # one consistent view of the state per scrape
            families = [*self._segments(), *self._tenants()]
            scalars = self._scalars()
        yield from families
        for name, doc, value in scalars:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g

    def _segments(self) -> list[Metric]:
        labels = ["segment", "tier"]
        cap = GaugeMetricFamily("kvcake_store_segment_capacity_bytes", "", labels=labels)
        used = GaugeMetricFamily("kvcake_store_segment_used_bytes", "", labels=labels)
        frag = GaugeMetricFamily(
            "kvcake_store_segment_fragmentation", "1 - largest free / free", labels=labels
        )
        for seg in self.state.segments.values():
            lbl = [seg.name, seg.tier.value]
            cap.add_metric(lbl, seg.allocator.capacity)
            used.add_metric(lbl, seg.allocator.allocated)
            frag.add_metric(lbl, seg.allocator.fragmentation())
        return [cap, used, frag]

    def _tenants(self) -> list[Metric]:
        used = GaugeMetricFamily(
            "kvcake_store_tenant_used_bytes", "bytes charged per tenant", labels=["tenant"]
        )
        quota = GaugeMetricFamily(
            "kvcake_store_tenant_quota_bytes", "byte quota per tenant (0 = none)", labels=["tenant"]
        )
        for tenant, st in self.state.tenants.stats().items():
            used.add_metric([tenant], st["used"])
            quota.add_metric([tenant], st["quota"])
        return [used, quota]

    def _scalars(self) -> list[tuple[str, str, float]]:
        st, dd, ev = self.state, self.state.dedup, self.state.events
        return [
            ("kvcake_store_objects", "objects in the pool", len(st.objects)),
            ("kvcake_store_clients", "live clients", len(st.clients)),
            ("kvcake_store_evicted_objects", "objects evicted from memory (total)", st.evicted_objects),
            ("kvcake_store_evicted_bytes", "bytes evicted from memory (total)", st.evicted_bytes),
            ("kvcake_store_offloads", "offloads to disk started (total)", st.offloads),
            ("kvcake_store_promotions", "promotions to memory started (total)", st.promotions),
            ("kvcake_store_quota_refusals", "puts refused by tenant quotas (total)", st.tenants.refused),
            ("kvcake_store_dedup_replays", "retried requests answered from the table", dd.replays),
            ("kvcake_store_dedup_stale", "stale duplicates refused", dd.stale),
            ("kvcake_store_dedup_sessions", "client sessions remembered", dd.sessions),
            ("kvcake_store_swept_puts", "unfinished puts swept (total)", st.swept),
            ("kvcake_store_events_seq", "last KV event sequence number", ev.seq),
            ("kvcake_store_events_dropped", "KV events dropped (queue full)", ev.dropped),
            # the file tier (store/filetier.py)
            ("kvcake_store_file_writes", "file-tier writes in flight", len(st.file_writes)),
            ("kvcake_store_file_unlinks", "file-tier files to unlink", len(st.file_unlinks)),
            ("kvcake_store_file_full", "puts without a file replica: quota full", st.file_full),
            ("kvcake_store_file_failed", "file-tier writes failed or given up", st.file_failed),
        ]  # fmt: skip


class MasterMetrics:
    def __init__(self, state: MasterState):
        self.registry = CollectorRegistry()
        self.ops = Counter(
            "kvcake_store_master_requests", "RPC requests", ["op"], registry=self.registry
        )
        self.latency = Histogram(
            "kvcake_store_master_request_seconds",
            "RPC handling time",
            ["op"],
            buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 1.0),
            registry=self.registry,
        )
        self.bad_frames = Counter(
            "kvcake_store_master_bad_frames", "undecodable requests", registry=self.registry
        )
        self.refused = Counter(
            "kvcake_store_master_refused_connections",
            "connections refused (master.max_connections)",
            registry=self.registry,
        )
        self.registry.register(_PoolCollector(state))
        self._children: dict[str, tuple[Counter, Histogram]] = {}

    def observe(self, op: str, seconds: float) -> None:
        children = self._children.get(op)
        if children is None:  # labels() costs a lock and a dict build: resolve once per op
            children = self._children[op] = (self.ops.labels(op), self.latency.labels(op))
        children[0].inc()
        children[1].observe(seconds)
