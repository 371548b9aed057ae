"""A storage node's HTTP side door: ``/health`` and ``/metrics`` (Prometheus), on the same
FastAPI/uvicorn stack as the master. Metrics are read from the node at scrape time, plus the
counts of the tasks it ran for the master."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvcake.store.verify import FAILURES

if TYPE_CHECKING:
    from kvcake.store.server import StoreServer


class _NodeCollector(Collector):
    def __init__(self, node: StoreServer):
        self.node = node

    def collect(self) -> Iterator[Metric]:
        n = self.node
        for name, doc, value in (
            ("kvcake_store_node_segment_bytes", "DRAM contributed to the pool", n.cfg.segment_size),
            ("kvcake_store_node_master_reachable", "1 if the last heartbeat got through", n.master_ok()),
            ("kvcake_store_node_disk_quota_bytes", "SSD tier quota (0 = none)", n.cfg.ssd_quota if n.disk else 0),
            ("kvcake_store_node_disk_used_bytes", "bytes of verified disk copies", n.disk.used_bytes() if n.disk else 0),
            ("kvcake_store_node_disk_objects", "verified disk copies", len(n.disk.index) if n.disk else 0),
        ):  # fmt: skip
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g
        refused = n.client.engine.server.fences.refused if n.client is not None else 0
        yield CounterMetricFamily(
            "kvcake_store_node_stale_writes_refused",
            "writes refused by their fence: a stale writer's (docs/store.md, Write fences)",
            value=refused,
        )


class NodeMetrics:
    def __init__(self, node: StoreServer):
        self.registry = CollectorRegistry()
        self.tasks = Counter(
            "kvcake_store_node_tasks",
            "tasks run for the master",
            ["kind", "ok"],
            registry=self.registry,
        )
        self.registry.register(_NodeCollector(node))
        self.registry.register(FAILURES)  # integrity failures of its tier copies and reads


def build_app(node: StoreServer, metrics: NodeMetrics) -> FastAPI:
    app = FastAPI(title="kvcake store-server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    def health() -> Response:
        ok = node.client is not None
        body = {
            "status": "ok" if ok else "starting",
            "segment": node.segment_name,
            "master": "ok" if node.master_ok() else "unreachable",
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    def scrape() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
