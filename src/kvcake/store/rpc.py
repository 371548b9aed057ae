"""Blocking client side of the master RPC: one TCP connection, one call at a time (thread-safe
by a lock), reconnected once on a broken connection."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading

import msgspec

from kvcake.core import framing
from kvcake.core.errors import FramingError
from kvcake.store import protocol as P
from kvcake.store.errors import RpcFailed, error_for


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RpcFailed(f"address must be host:port, got {address!r}")
    return host, int(port)


class MasterConnection:
    def __init__(self, address: str, timeout_s: float = 30.0):
        self.address = address
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def _connect(self) -> socket.socket:
        host, port = split_address(self.address)
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout_s)
        except OSError as exc:
            raise RpcFailed(f"cannot reach master at {self.address}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def call(self, msg: msgspec.Struct) -> P.Reply:
        """Send one request; return its reply, raising the typed error of a whole-call failure."""
        frame: framing.Frame[msgspec.Struct] | None = None
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._sock = self._connect()
                try:
                    framing.send_frame(self._sock, P.REQUEST_CODEC, next(self._ids), msg)
                    frame = framing.read_frame(self._sock, P.REPLY_CODEC)
                    if frame is None:
                        raise ConnectionError("master closed the connection")
                    break
                except (OSError, ConnectionError, FramingError) as exc:
                    self._close_locked()
                    if attempt == 1:
                        raise RpcFailed(f"master {self.address}: {exc}") from exc
        assert frame is not None
        reply = frame.msg
        if isinstance(reply, P.ErrorReply):
            raise error_for(reply.code, reply.message)
        assert isinstance(reply, P.Reply)
        if reply.code != 0:
            raise error_for(reply.code, reply.message)
        return reply

    def _close_locked(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._close_locked()
