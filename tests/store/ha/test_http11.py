"""The etcd gateway's HTTP/1.1 client against a real loopback socket server that answers with
canned bytes: Content-Length and chunked bodies, keep-alive, an idle connection the server
closed (reopened once), and malformed or truncated replies (a clear error, never a hang)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from kvcake.store.ha.http11 import Http11, HttpError

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}'
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'3\r\n{"a\r\n4;ext=1\r\n":2}\r\n0\r\nX-Trailer: t\r\n\r\n'
)


class Canned:
    """Accepts connections; for each request read, sends the next reply: bytes; None = close
    the connection without answering; ("close", bytes) = send, then close."""

    def __init__(self, replies: list[bytes | tuple[str, bytes] | None]):
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.replies:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                while self.replies:
                    data = conn.recv(65536)
                    if not data:
                        break
                    self.requests.append(data)
                    reply = self.replies.pop(0)
                    if reply is None:
                        break
                    if isinstance(reply, tuple):
                        conn.sendall(reply[1])
                        break
                    conn.sendall(reply)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def canned() -> Iterator[type[Canned]]:
    made: list[Canned] = []

    def make(replies: list[bytes | tuple[str, bytes] | None]) -> Canned:
        made.append(Canned(replies))
        return made[-1]

    yield make  # type: ignore[misc]
    for c in made:
        c.close()


def test_content_length_and_chunked_replies_on_one_kept_alive_connection(canned) -> None:
    srv = canned([OK, CHUNKED, OK])
    http = Http11("127.0.0.1", srv.port)
    assert http.post("/v3/kv/put", b'{"k":1}', 5) == (200, b'{"a":1}')
    assert http.post("/v3/kv/put", b"{}", 5) == (200, b'{"a":2}')
    assert http.post("/v3/kv/put", b"{}", 5) == (200, b'{"a":1}')
    assert srv.connections == 1
    first = srv.requests[0]
    assert first.startswith(b"POST /v3/kv/put HTTP/1.1\r\n")
    assert b"Content-Length: 7\r\n" in first and first.endswith(b'\r\n\r\n{"k":1}')
    http.close()


def test_an_idle_connection_closed_by_the_server_is_reopened_once(canned) -> None:
    srv = canned([OK, None, OK])
    http = Http11("127.0.0.1", srv.port)
    assert http.post("/a", b"{}", 5)[0] == 200
    assert http.post("/a", b"{}", 5) == (200, b'{"a":1}')  # the server dropped the first one
    assert srv.connections == 2
    http.close()


def test_a_fresh_connection_that_closes_is_an_error_not_a_retry(canned) -> None:
    srv = canned([None, OK])
    http = Http11("127.0.0.1", srv.port)
    with pytest.raises(HttpError, match="closed"):
        http.post("/a", b"{}", 5)
    assert srv.connections == 1
    http.close()


@pytest.mark.parametrize(
    "reply, message",
    [
        (b"SMTP 220 hello\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n", "malformed"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "bad body length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY\r\n", "CRLF"),
    ],
)
def test_malformed_replies_raise_a_clear_error(canned, reply: bytes, message: str) -> None:
    srv = canned([reply])
    http = Http11("127.0.0.1", srv.port)
    with pytest.raises(HttpError, match=message):
        http.post("/a", b"{}", 5)
    assert http.sock is None  # never reused after a bad reply


def test_a_reply_cut_short_is_an_error_and_not_resent(canned) -> None:
    partial = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{partial"
    srv = canned([OK, ("close", partial), OK])
    http = Http11("127.0.0.1", srv.port)
    http.post("/a", b"{}", 5)
    with pytest.raises(HttpError, match="middle of a reply"):
        http.post("/a", b"{}", 5)
    assert len(srv.requests) == 2  # the request was not sent again


def test_a_silent_server_times_out(canned) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    try:
        http = Http11("127.0.0.1", srv.getsockname()[1])
        with pytest.raises(OSError):
            http.post("/a", b"{}", 0.3)
    finally:
        srv.close()
