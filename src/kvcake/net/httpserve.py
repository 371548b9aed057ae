"""kvcake's one way to run an HTTP server (uvicorn): :func:`serve` in the calling thread on a
socket bound up front (the proxy, the instance, the vLLM fleet proxy: a port conflict fails at
once with a message saying which setting to change, and the ready line names the bound port),
:class:`HttpThread` on a background thread (the master and store-server are threaded processes;
their HTTP is a side door for admin, health and metrics; Mooncake's HTTP metadata server). Both
build their server with :func:`uvicorn_server`: warnings only, no access log."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Literal

import httpx

from kvcake.core import auth as _auth
from kvcake.core.http_auth import HttpRefused, HttpVerifier, sign

# Answered without credentials: a liveness probe carries no secret (and learns nothing).
OPEN_PATHS = frozenset({"/health"})


class RequireAuth:
    """ASGI middleware: every HTTP request but :data:`OPEN_PATHS` needs a signed
    ``x-kvcake-auth`` header for ``service`` at this server (``core/http_auth.py``: covers
    method, target, body, time, nonce and audience; accepted once) or ``Authorization:
    Bearer <secret>`` (private networks only); else 401 (503 while the nonce cache is full,
    413 for a signed body beyond ``auth.http_max_body``). The body of a signed request is read
    in full and checked before the app sees any of it."""

    def __init__(self, app: Any, auth: _auth.Authenticator, service: str):
        self.app = app
        self.auth = auth
        self.verifier = HttpVerifier(auth, service)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        bearer = self.auth.bearer_ok(headers.get("authorization", ""))
        if bearer:
            return await self.app(scope, receive, send)
        try:
            if bearer is False:
                raise HttpRefused("unauthorized: wrong bearer secret")
            body = await self._verified_body(scope, receive, headers)
        except HttpRefused as exc:
            return await _refuse(send, exc)
        await self.app(scope, _replay(body, receive), send)

    async def _verified_body(self, scope: Any, receive: Any, headers: dict[str, str]) -> bytes:
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        claim = self.verifier.check_header(headers, scope["method"], target)
        body = await _read_body(receive, self.verifier.policy.max_body)
        self.verifier.check_body(claim, body)
        await self.verifier.check_audience(claim, scope.get("server"))
        self.verifier.admit(claim)
        return body


async def _read_body(receive: Any, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise HttpRefused("the client went away before sending the body", 400)
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpRefused(f"a signed body is limited to {limit} B (auth.http_max_body)", 413)
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """The app's ``receive``: the checked body once, then the connection's own events."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _refuse(send: Any, exc: HttpRefused) -> None:
    hint = f"send a signed {_auth.HTTP_HEADER} header (or Authorization: Bearer <shared secret>)"
    text = str(exc) if exc.status != 401 else f"{exc}; {hint}"
    body = json.dumps({"error": text}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if exc.status == 401:
        head.append((b"www-authenticate", b'Bearer realm="kvcake"'))
    elif exc.status == 503:
        head.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": exc.status, "headers": head})
    await send({"type": "http.response.body", "body": body})


Lifespan = Literal["auto", "on", "off"]


def uvicorn_server(app: Any, lifespan: Lifespan = "off", graceful_s: int | None = None) -> Any:
    """A ``uvicorn.Server`` for ``app``; ``graceful_s``: how long a stop waits for requests in
    flight (None: until they end)."""
    # lazy: start-up: only a process that serves HTTP loads uvicorn (`kvcake top` signs with
    # client_auth and serves nothing)
    import uvicorn

    cfg = uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan,
                         timeout_graceful_shutdown=graceful_s)  # fmt: skip
    return uvicorn.Server(cfg)


def serve(
    app: Any, sock: socket.socket, lifespan: Lifespan = "auto", graceful_s: int | None = None
) -> None:
    """Serve ``app`` on the listening ``sock`` in this thread until SIGINT / SIGTERM."""
    try:
        uvicorn_server(app, lifespan, graceful_s).run(sockets=[sock])
    finally:
        sock.close()


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
        """``auth``: the shared secret every request (but ``/health``) must show, signed for
        the service ``name``; None = no secret, which is only allowed on loopback."""
        _auth.check_bind(host, auth, name)
        if auth is not None:
            app = RequireAuth(app, auth, name)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.listen(128)
        self.server = uvicorn_server(app)
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


def client_auth(auth: _auth.Authenticator | None, service: str) -> Any:
    """An ``httpx.Auth`` that signs each request for ``service`` at the request's host:port
    (method, target, body, a fresh nonce: the secret itself never goes over the wire), or
    None without a secret."""
    if auth is None:
        return None

    signer: _auth.Authenticator = auth

    class _Sign(httpx.Auth):
        requires_request_body = True  # a streamed body is read so that it can be digested

        def auth_flow(self, request: httpx.Request) -> Any:
            url = request.url
            port = url.port or (443 if url.scheme == "https" else 80)
            authority = f"{url.host}:{port}"
            request.headers.update(
                sign(signer, service, authority, request.method, url.raw_path, request.content)
            )
            yield request

    return _Sign()
