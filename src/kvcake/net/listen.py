"""Listening sockets for the serving processes."""

from __future__ import annotations

import socket

from kvcake.core.errors import ConfigError


def bind(host: str, port: int, what: str) -> socket.socket:
    """A listening socket, or a :class:`ConfigError` that says what to change."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"{what}: cannot listen on {host}:{port} ({exc.strerror}); choose another port "
            f"(or 0 for a free one)"
        ) from exc
    sock.listen(512)
    return sock
