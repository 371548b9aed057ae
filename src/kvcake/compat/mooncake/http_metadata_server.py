"""``mooncake.http_metadata_server`` (the wheel's pure-Python ``mooncake_http_metadata_server``):
``KVBootstrapServer`` with 0.3.13's semantics, served by uvicorn instead of aiohttp.

As the wheel: ``/metadata?key=K`` answers GET (200 value / 404 ``metadata not found``), PUT (200
``metadata updated``; a second PUT of a key containing ``rpc_meta`` is 400 ``Duplicate rpc_meta
key not allowed``, even with the same value) and DELETE (200 ``metadata deleted`` / 404); no key is
400, any other method 405. The handlers (``_handle_get`` / ``_handle_put`` / ``_handle_delete``)
are coroutines returning a reply with ``.status`` and ``.text`` as aiohttp's ``web.Response``, so
code that calls them directly (Mooncake's own suite does) works unchanged.

Differences: the default host is 127.0.0.1, not 0.0.0.0 (kvcake binds loopback unless told); the
store is bounded (``MetadataKV``: 65,536 keys, 1 MiB a value; 507 / 413 beyond)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from kvcake.net.httpserve import uvicorn_server
from kvcake.store.metadata_http import CONTENT_TYPE, MetadataKV

log = logging.getLogger(__name__)


class KVPoll(Enum):
    """Status of the KV server."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


@dataclass(frozen=True)
class Reply:
    """What a handler answers (the fields of aiohttp's ``web.Response`` that callers read)."""

    status: int
    body: bytes
    content_type: str = "application/json"

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def _reply(status: int, body: bytes | str) -> Reply:
    return Reply(status, body.encode() if isinstance(body, str) else body)


class KVBootstrapServer:
    """HTTP server for storing and retrieving metadata (Mooncake's, over kvcake's MetadataKV)."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.port = port
        self.host = host
        self.store = MetadataKV()
        self.lock = asyncio.Lock()
        self.thread: threading.Thread | None = None
        self._server: Any = None

    async def _handle_get(self, key: str) -> Reply:
        async with self.lock:
            value = self.store.get(key)
        return _reply(404, "metadata not found") if value is None else _reply(200, value)

    async def _handle_put(self, key: str, request: Any) -> Reply:
        data = bytes(await request.read())
        if len(data) > self.store.max_value:
            return _reply(413, f"metadata value larger than {self.store.max_value} bytes")
        async with self.lock:
            if "rpc_meta" in key and self.store.get(key) is not None:
                return _reply(400, "Duplicate rpc_meta key not allowed")
            try:
                self.store.put(key, data)
            except (PermissionError, OverflowError) as exc:
                return _reply(403 if isinstance(exc, PermissionError) else 507, str(exc))
        return _reply(200, "metadata updated")

    async def _handle_delete(self, key: str) -> Reply:
        async with self.lock:
            if self.store.get(key) is None:
                return _reply(404, "metadata not found")
            try:
                self.store.delete(key)
            except PermissionError as exc:
                return _reply(403, str(exc))
        return _reply(200, "metadata deleted")

    async def _handle_metadata(self, request: Any) -> Reply:
        """The route's handler, as the wheel's: ``request`` has aiohttp's ``.method``, ``.query``
        and ``await .read()`` (Mooncake's newer suite calls it directly with such an object)."""
        key = str(request.query.get("key", "")).strip()
        if not key:
            return _reply(400, "metadata key is required")
        method = request.method
        if method == "GET":
            return await self._handle_get(key)
        if method == "PUT":
            return await self._handle_put(key, request)
        if method == "DELETE":
            return await self._handle_delete(key)
        return _reply(405, "Method not allowed")

    def _app(self) -> Any:
        app = FastAPI()

        class _Request:  # aiohttp's request (method, query, read()) over Starlette's
            def __init__(self, request: Request):
                self._request = request
                self.method = request.method
                self.query = request.query_params

            async def read(self) -> bytes:
                return await self._request.body()

        methods = ["GET", "PUT", "DELETE", "POST", "PATCH", "HEAD", "OPTIONS"]

        @app.api_route("/metadata", methods=methods)
        async def metadata(request: Request) -> Response:
            r = await self._handle_metadata(_Request(request))
            media = CONTENT_TYPE if r.content_type == "application/json" else r.content_type
            return Response(r.body, status_code=r.status, media_type=media)

        return app

    def run(self) -> threading.Thread:
        """Start the server in a background thread; returns once it listens. A port that cannot be
        bound raises OSError here (the 0.3.13 wheel logs the error from its thread and returns as
        if started; newer Mooncake raises, as kvcake does)."""
        startup: Future[socket.socket] = Future()
        self.thread = threading.Thread(
            target=self._serve, args=(startup,), daemon=True, name="kv-bootstrap"
        )
        self.thread.start()
        sock = startup.result(timeout=10.0)  # re-raises the bind error
        self.port = sock.getsockname()[1]
        deadline = time.monotonic() + 10.0
        while not self._server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            raise OSError(f"HTTP metadata server on {self.host}:{self.port} did not start")
        log.info("HTTP Metadata Server started on %s:%s", self.host, self.port)
        return self.thread

    def _serve(self, startup: Future[socket.socket]) -> None:
        try:
            sock = socket.create_server((self.host, self.port))
        except OSError as exc:
            log.error("Server error: %s", exc)
            startup.set_exception(exc)
            return
        self._server = uvicorn_server(self._app(), lifespan="auto")
        startup.set_result(sock)
        try:
            self._server.run(sockets=[sock])
        finally:
            sock.close()

    def close(self) -> None:
        """Shutdown the server."""
        if self._server is not None:
            self._server.should_exit = True
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout=2)

    def poll(self) -> KVPoll:
        """Poll the server status."""
        if self.thread is None or not self.thread.is_alive():
            return KVPoll.Failed
        return KVPoll.Success


def main(argv: list[str] | None = None) -> int:
    """``mooncake_http_metadata_server``: serve until SIGINT / SIGTERM."""
    p = argparse.ArgumentParser(description="HTTP Metadata Server for Mooncake (kvcake)")
    p.add_argument("--port", type=int, default=8080, help="Port to listen on")
    p.add_argument("--host", default="127.0.0.1", help="Host to bind to")
    p.add_argument("--log-level", default="INFO", help="Logging level")
    args = p.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO))
    server = KVBootstrapServer(port=args.port, host=args.host)
    thread = server.run()
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
