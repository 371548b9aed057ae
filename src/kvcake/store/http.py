"""The master's HTTP endpoints, named as Mooncake's: ``/metrics`` (Prometheus), ``/health``,
``/get_all_keys``, ``/query_key?key=``, ``/get_all_segments``. A stdlib threading HTTP server:
these are low-rate admin endpoints and need no framework."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from kvcake.store.master_server import Master


def _segments(master: Master) -> list[dict[str, Any]]:
    with master.state.lock:
        return [
            {
                "name": s.name,
                "client": s.client,
                "host": s.host,
                "tier": s.tier.value,
                "capacity": s.allocator.capacity,
                "used": s.allocator.allocated,
                "fragmentation": round(s.allocator.fragmentation(), 4),
            }
            for s in master.state.segments.values()
        ]


def _query(master: Master, key: str) -> tuple[int, Any]:
    with master.state.lock:
        obj = master.state.objects.get(key)  # type: ignore[call-overload]
        if obj is None:
            return 404, {"error": f"key {key!r} not found"}
        return 200, {
            "key": key,
            "size": obj.size,
            "status": obj.status.value,
            "hard_pin": obj.hard_pin,
            "leased": master.state.leased(obj),
            "replicas": [
                {
                    "segment": r.segment,
                    "offset": r.offset,
                    "size": r.size,
                    "tier": r.tier.value,
                    "complete": r.complete,
                }
                for r in obj.replicas
            ],
        }


def _handler(master: Master) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: admin endpoints
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: Any) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path == "/metrics":
                self._send(200, generate_latest(master.metrics.registry), CONTENT_TYPE_LATEST)
            elif url.path == "/health":
                self._json(200, {"status": "ok"})
            elif url.path == "/get_all_keys":
                with master.state.lock:
                    keys = [k for k, o in master.state.objects.items() if o.readable()]
                self._json(200, keys)
            elif url.path == "/get_all_segments":
                self._json(200, _segments(master))
            elif url.path == "/query_key":
                key = parse_qs(url.query).get("key", [""])[0]
                if not key:
                    self._json(400, {"error": "missing ?key="})
                else:
                    self._json(*_query(master, key))
            else:
                self._json(404, {"error": f"no endpoint {url.path}"})

    return Handler


class MasterHttp:
    def __init__(self, master: Master, host: str, port: int):
        self.server = ThreadingHTTPServer((host, port), _handler(master))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="master-http")

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=2)
