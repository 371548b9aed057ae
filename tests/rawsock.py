"""Raw sockets for tests that speak to a server without its client (unauthenticated frames,
malformed input): connect to ``host:port`` and read until the server closes."""

from __future__ import annotations

import socket


def raw(address: str, timeout: float = 5.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout)
    s.settimeout(timeout)
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    out = bytearray()
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return bytes(out)
