"""The master's HTTP endpoints (FastAPI on uvicorn, in a thread of the master process), named as
Mooncake's: ``/metrics`` (Prometheus), ``/health``, ``/get_all_keys``, ``/query_key?key=``,
``/get_all_segments``, ``/hot_keys?limit=`` (kvcake's: the most recently used objects and
their replicas, for the dashboard), and Mooncake's HTTP metadata protocol ``/metadata?key=``
(:mod:`kvcake.store.metadata_http`), and the routers' cache queries ``/batch_query_keys`` and
``/query`` (:mod:`kvcake.store.router_queries`). Everything reads the state through ``MasterState``
methods. More routers (e.g. the Mooncake compat layer's, issue 14) can be added with
``Master.extra_routers.append(router)`` before ``start``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvcake.core.http_auth import MASTER_HTTP
from kvcake.net.httpserve import HttpThread
from kvcake.store.metadata_http import metadata_router
from kvcake.store.mooncake_metrics import MooncakeMasterCollector
from kvcake.store.router_queries import router_queries

if TYPE_CHECKING:
    from kvcake.store.master_server import Master


def build_app(master: Master) -> FastAPI:
    state = master.state
    mooncake = CollectorRegistry(auto_describe=False)  # Mooncake's master metric names too
    mooncake.register(MooncakeMasterCollector(state))
    app = FastAPI(title="kvcake master", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def leader_only(request: Request, call_next: Any) -> Any:
        """An HA master answers only while its lease holds (store/leadership.py): checked
        before the work and again right before the response goes out."""
        if master.leadership.held():
            response = await call_next(request)
            if master.leadership.held():
                return response
        message = f"not the leader: the lease of term {master.leadership.term} is not held"
        return JSONResponse({"error": message}, status_code=503)

    @app.get("/health")
    def health() -> Any:
        return {"status": "ok", "segments": len(state.segment_stats())}

    @app.get("/metrics")
    def metrics() -> Response:
        text = generate_latest(master.metrics.registry) + generate_latest(mooncake)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/get_all_keys")
    def get_all_keys() -> Any:
        return state.readable_keys()

    @app.get("/get_all_segments")
    def get_all_segments() -> Any:
        return state.segment_stats()

    @app.get("/query_key")
    def query_key(key: str = "") -> Any:
        if not key:
            return JSONResponse({"error": "missing ?key="}, status_code=400)
        found = state.describe_key(key)
        if found is None:
            return JSONResponse({"error": f"key {key!r} not found"}, status_code=404)
        return found

    @app.get("/hot_keys")
    def hot_keys(limit: str = "20") -> Any:
        if not limit.isdigit() or not 1 <= int(limit) <= 1000:
            return JSONResponse(
                {"error": f"limit must be an integer in [1, 1000], got {limit!r}"}, status_code=400
            )
        return state.hottest(int(limit))

    app.include_router(metadata_router(master.metadata_kv))
    app.include_router(router_queries(master))  # /batch_query_keys, /query (routers)
    # Extension point: routers registered by other layers (compat's Mooncake admin API, ...).
    for router in master.extra_routers:
        app.include_router(router)
    return app


class MasterHttp(HttpThread):
    def __init__(self, master: Master, host: str, port: int):
        super().__init__(build_app(master), host, port, name=MASTER_HTTP, auth=master.auth)
