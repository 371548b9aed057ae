"""One kept-alive HTTP/1.1 connection that POSTs JSON and reads the reply: just what the etcd
JSON gateway needs (replies with ``Content-Length`` or chunked bodies).

Hand-written on purpose (the project otherwise uses httpx): in a durable master under 16
clients, ``http.client``'s header parsing (``email.feedparser``, pure Python) was 17 % of the
GIL time (py-spy, ``benchmarks/ha_bench.py``), and httpx costs twice ``http.client``'s CPU per
call (docs/benchmarks.md, issue 15). Not a general HTTP client: no redirects, no TLS, no
``Expect``, no proxies.
"""

from __future__ import annotations

import socket

MAX_HEAD = 64 * 1024  # status line + headers
MAX_BODY = 64 * 1024 * 1024  # etcd refuses requests over 1.5 MiB; a range can answer more


class HttpError(OSError):
    """A malformed or truncated reply, or a closed connection."""


class _Closed(HttpError):
    """The server closed the connection before a reply started (an idle kept-alive one)."""


class Http11:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        self._buf = b""
        self._replied = False  # a byte of the current reply arrived: never resend then

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self._buf = b""

    def post(self, path: str, payload: bytes, timeout_s: float) -> tuple[int, bytes]:
        """(status, body). A kept-alive connection the server closed while idle is reopened
        once; any other failure raises :class:`OSError` (the connection is then closed)."""
        reused = self.sock is not None
        try:
            return self._post(path, payload, timeout_s)
        except (ConnectionResetError, BrokenPipeError, _Closed):
            self.close()
            if not reused:
                raise
        except OSError:
            self.close()
            raise
        try:
            return self._post(path, payload, timeout_s)
        except OSError:
            self.close()
            raise

    def _post(self, path: str, payload: bytes, timeout_s: float) -> tuple[int, bytes]:
        try:
            return self._exchange(path, payload, timeout_s)
        except ValueError as exc:  # a number that does not parse
            raise HttpError(f"malformed reply: {exc}") from exc

    def _exchange(self, path: str, payload: bytes, timeout_s: float) -> tuple[int, bytes]:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout_s)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout_s)
        self._replied = False
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.sock.sendall(head.encode("latin-1") + payload)
        status, headers = self._head()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked()
        else:
            body = self._exactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body

    def _recv(self) -> None:
        assert self.sock is not None
        data = self.sock.recv(65536)
        if not data:
            if self._replied:
                raise HttpError("connection closed in the middle of a reply")
            raise _Closed("connection closed by the server")
        self._replied = True
        self._buf += data

    def _line(self, limit: int = MAX_HEAD) -> bytes:
        while (i := self._buf.find(b"\r\n")) < 0:
            if len(self._buf) > limit:
                raise HttpError("reply line too long")
            self._recv()
        line, self._buf = self._buf[:i], self._buf[i + 2 :]
        return line

    def _head(self) -> tuple[int, dict[str, str]]:
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            if len(self._buf) > MAX_HEAD:
                raise HttpError("reply head too long")
            self._recv()
        lines = self._buf[:end].decode("latin-1").split("\r\n")
        self._buf = self._buf[end + 4 :]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"bad status line {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    def _exactly(self, n: int) -> bytes:
        if not 0 <= n <= MAX_BODY:
            raise HttpError(f"bad body length {n}")
        while len(self._buf) < n:
            self._recv()
        body, self._buf = self._buf[:n], self._buf[n:]
        return body

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            size = int(self._line().split(b";", 1)[0].strip() or b"x", 16)
            if size == 0:
                while self._line():  # trailers, then the empty line
                    pass
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise HttpError("chunked body too large")
            parts.append(self._exactly(size))
            if self._line():
                raise HttpError("chunk not followed by CRLF")
