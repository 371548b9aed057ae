"""Serve a FastAPI app with uvicorn on a background thread (the master and store-server are
threaded processes; their HTTP is a side door for admin, health and metrics)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from kvcake.core import auth as _auth

# Answered without credentials: a liveness probe carries no secret (and learns nothing).
OPEN_PATHS = frozenset({"/health"})


class RequireAuth:
    """ASGI middleware: every HTTP request but :data:`OPEN_PATHS` needs ``Authorization:
    Bearer <secret>`` or the HMAC header (``kvcake.core.auth.HTTP_HEADER``); else 401."""

    def __init__(self, app: Any, auth: _auth.Authenticator):
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.auth.http_ok(headers, scope["method"], scope["path"]):
            return await self.app(scope, receive, send)
        hint = f"send Authorization: Bearer <shared secret> or the {_auth.HTTP_HEADER} header"
        body = json.dumps({"error": f"unauthorized: {hint}"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b'Bearer realm="kvcake"'),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class HttpThread:
    """``h = HttpThread(app, "127.0.0.1", 0); h.start(); h.address; h.stop()``. The socket is
    bound in the constructor, so a busy port fails there with OSError and ``address`` is
    known before the server runs."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        name: str = "http",
        auth: _auth.Authenticator | None = None,
    ):
        """``auth``: the shared secret every request (but ``/health``) must show; None = no
        secret, which is only allowed on loopback."""
        import uvicorn

        _auth.check_bind(host, auth, name)
        if auth is not None:
            app = RequireAuth(app, auth)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.listen(128)
        cfg = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name=name, daemon=True
        )

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def start(self, timeout: float = 10.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and self.thread.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError("HTTP server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        self.sock.close()


def client_auth(auth: _auth.Authenticator | None) -> Any:
    """An ``httpx.Auth`` that signs each request with the HMAC header (the secret itself never
    goes over the wire), or None without a secret."""
    if auth is None:
        return None
    import httpx

    signer: _auth.Authenticator = auth

    class _Sign(httpx.Auth):
        def auth_flow(self, request: httpx.Request) -> Any:
            request.headers.update(signer.http_headers(request.method, request.url.path))
            yield request

    return _Sign()
