"""``mooncake.http_metadata_server.KVBootstrapServer`` over real HTTP: the statuses, bodies and
content types of the 0.3.13 wheel's pure-Python server for the same request sequence (recorded
from the wheel, 2026-12-01: its module run in /work/mooncake-venv on 127.0.0.1), plus kvcake's
bounds on malformed input."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from kvcake.compat.mooncake.http_metadata_server import KVBootstrapServer, KVPoll

RPC = "?key=mooncake/rpc_meta/h:1"
# (method, query, body) -> (status, text), all application/json, as the wheel answered.
WHEEL = [
    ("GET", "?key=a", None, 404, "metadata not found"),
    ("PUT", "?key=a", b"v1", 200, "metadata updated"),
    ("GET", "?key=a", None, 200, "v1"),
    ("PUT", "?key=a", b"v2", 200, "metadata updated"),
    ("GET", "?key=a", None, 200, "v2"),
    ("PUT", RPC, b"x", 200, "metadata updated"),
    ("PUT", RPC, b"x", 400, "Duplicate rpc_meta key not allowed"),
    ("DELETE", "?key=a", None, 200, "metadata deleted"),
    ("DELETE", "?key=a", None, 404, "metadata not found"),
    ("GET", "", None, 400, "metadata key is required"),
    ("GET", "?key=%20", None, 400, "metadata key is required"),
    ("POST", "?key=a", b"z", 405, "Method not allowed"),
    ("PUT", "?key=e", b"", 200, "metadata updated"),
    ("GET", "?key=e", None, 200, ""),
]


@pytest.fixture(scope="module")
def server() -> Iterator[KVBootstrapServer]:
    srv = KVBootstrapServer(port=0)
    assert srv.poll() is KVPoll.Failed  # not started yet
    srv.run()
    assert srv.poll() is KVPoll.Success and srv.port != 0
    yield srv
    srv.close()
    assert srv.poll() is KVPoll.Failed


def test_same_answers_as_the_wheel(server: KVBootstrapServer) -> None:
    base = f"http://127.0.0.1:{server.port}/metadata"
    with httpx.Client(timeout=5) as c:
        got = []
        for method, query, body, _, _ in WHEEL:
            r = c.request(method, base + query, content=body)
            assert r.headers["content-type"].startswith("application/json")
            got.append((method, query, body, r.status_code, r.text))
    assert got == WHEEL


def test_bad_input_is_refused_and_the_server_lives(server: KVBootstrapServer) -> None:
    base = f"http://127.0.0.1:{server.port}/metadata"
    with httpx.Client(timeout=5) as c:
        big = c.put(base + "?key=big", content=b"x" * (server.store.max_value + 1))
        assert big.status_code == 413 and "larger than" in big.text
        assert c.get(base + "?key=big").status_code == 404
        view = c.put(base + "?key=kvcake/segments/x", content=b"v")
        assert view.status_code == 403
        assert c.get(base + "?key=ok").status_code == 404  # still serving


def test_handlers_called_directly_as_mooncake_suite_does() -> None:
    class Req:
        def __init__(self, data: bytes):
            self.data = data

        async def read(self) -> bytes:
            return self.data

    async def run() -> list[int]:
        srv = KVBootstrapServer(port=0)  # never started: the handlers need no server
        a = await srv._handle_put("mooncake/rpc_meta/x", Req(b"1"))
        b = await srv._handle_put("mooncake/rpc_meta/x", Req(b"1"))
        c = await srv._handle_get("mooncake/rpc_meta/x")
        assert c.text == "1"
        return [a.status, b.status, c.status]

    assert asyncio.run(run()) == [200, 400, 200]


def test_route_handler_takes_an_aiohttp_style_request_as_the_wheels() -> None:
    """``_handle_metadata(request)`` as the wheel's (Mooncake's newer suite calls it with an object
    carrying ``method``, ``query``, ``read()``): keys stripped, blank refused, ``key in store``."""

    class Req:
        def __init__(self, method: str, key: str | None, body: bytes = b""):
            self.method, self.body = method, body
            self.query = {} if key is None else {"key": key}

        async def read(self) -> bytes:
            return self.body

    async def run(srv: KVBootstrapServer) -> list[tuple[int, bytes, str]]:
        calls = [
            Req("PUT", "  k  ", b"v"),
            Req("GET", "k"),
            Req("PUT", "   ", b"v"),
            Req("GET", None),
        ]
        return [
            (r.status, r.body, r.content_type)
            for r in [await srv._handle_metadata(c) for c in calls]
        ]

    srv = KVBootstrapServer(port=0)
    got = asyncio.run(run(srv))
    js = "application/json"  # the wheel's content type for every reply, errors too
    assert got[:2] == [(200, b"metadata updated", js), (200, b"v", js)]
    assert got[2:] == [(400, b"metadata key is required", js)] * 2
    assert "k" in srv.store and "  k  " not in srv.store and "" not in srv.store


def test_a_port_in_use_raises_instead_of_a_dead_server() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        srv = KVBootstrapServer(port=taken.getsockname()[1])
        with pytest.raises(OSError):
            srv.run()
        assert srv.thread is not None
        srv.thread.join(timeout=2)
        assert srv.poll() is KVPoll.Failed
